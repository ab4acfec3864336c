"""The recipe: one object for CLI flags, YAML files and manifests; validated all at once (torch-free).

    keys.py      the table of keys: each key's flag, kind, choices, default, help and commands
    values.py    one key's value, read and checked by its kind
    validate.py  a whole recipe: its method, unknown keys, every value, the rules across keys
    recipe.py    the Recipe and Consensus dataclasses (``Recipe.from_dict``)
    load.py      a recipe from a YAML file or an output's vecmerge.json
    docs.py      the keys for users: ``vecmerge run --help`` and docs/RECIPES.md
"""

from .docs import recipe_help, recipe_markdown, schema
from .keys import KEY, KEYS, Key
from .load import load, manifest_root, with_absolute_inputs
from .recipe import Consensus, Recipe

__all__ = ["KEY", "KEYS", "Key", "Consensus", "Recipe", "load", "manifest_root", "with_absolute_inputs", "schema",
           "recipe_help", "recipe_markdown"]
