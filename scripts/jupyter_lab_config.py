"""JupyterLab server settings for `make lab` (scripts/lab.sh passes this file with --config).

Saving a lesson must not dirty the committed notebook: the ``.ipynb`` files
under ``notebooks/`` are kept stripped (no outputs, no execution counts, only
the kernelspec and jupytext metadata, only tags on cells; see
scripts/nbsync.py), so the save hook below writes them that way. The page
keeps showing the outputs; they are simply not written to disk. Notebooks
elsewhere are saved as they are.
"""

KEEP_NOTEBOOK_METADATA = ("jupytext", "kernelspec")
KEEP_CELL_METADATA = ("tags",)


def strip_lesson_outputs(model, path, contents_manager=None, **kwargs):
    """A pre-save hook: a notebook under notebooks/ is written stripped, as it is committed."""
    if model.get("type") != "notebook" or not str(path).strip("/").startswith("notebooks/"):
        return
    notebook = model["content"]
    notebook["metadata"] = {k: v for k, v in notebook.get("metadata", {}).items() if k in KEEP_NOTEBOOK_METADATA}
    for cell in notebook.get("cells", []):
        cell["metadata"] = {k: v for k, v in cell.get("metadata", {}).items() if k in KEEP_CELL_METADATA}
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None


c = get_config()  # noqa: F821 (provided by the config loader)
c.ContentsManager.pre_save_hook = strip_lesson_outputs
