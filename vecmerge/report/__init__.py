"""Text for people and JSON for machines: tables, CSV, markdown, plots (the only importers of tabulate and
matplotlib).
"""
