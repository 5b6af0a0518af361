"""The bottom layer: value objects, inputs and their validation, layouts, settings, errors.

Nothing here imports from any other gemmtune sub-package.
"""
