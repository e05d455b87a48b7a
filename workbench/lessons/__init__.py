"""What the lessons in ``notebooks/`` compute and write: their tables, sentences and figures.

A lesson cell stays short (a few lines that call in here); the prose it prints is built from the
numbers it measured or simulated, so a sentence changes when its number does. One module per topic.
"""
