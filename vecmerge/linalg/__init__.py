"""The factored algebra: LowRank, shared subspaces, dense updates, the randomized SVD, the one rank cut, merge
kernels, the thread pool.
"""
