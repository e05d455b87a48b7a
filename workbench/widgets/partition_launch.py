"""The partition editor's Launch: the current cut as a ``RunConfig``, launched as a job with its monitor."""

from __future__ import annotations

from typing import Any

from .partition_state import _zoo_names

__all__ = ["EditorLaunch"]


class EditorLaunch:
    """The launch part of :class:`~workbench.widgets.partition_editor.PartitionEditor` (which derives from it):
    it reads the editor's state, plan and costs, and writes ``job``, ``monitor`` and ``launch_output``."""

    def run_config(self, **overrides: Any):
        """The ``RunConfig`` that trains the current partition with the controls' plan."""
        from ..core.config import RunConfig, merge_changes

        if self.state is None:
            raise ValueError("the editor has no valid partition to launch; fix the configuration first")
        plan = self.plan(partition=str(self.state.partition))
        data = dict(model=self.costs.model, plan=plan.to_dict(), name=f"editor-{plan.family}", data=self._data(),
                    training={"global_batch": self.costs.batch_size * plan.dp, "steps": self.launch_steps})
        return RunConfig.from_dict(merge_changes(data, overrides))

    def _data(self) -> dict[str, Any]:
        """Real data of the model's kind, so the loss falls: byte text for language models (at the profiled
        sequence length), the handwritten digits for the others."""
        from ..models.zoo import ZOO

        entry = ZOO.get(self.costs.model)
        if entry is not None and any(k in entry.defaults for k in ("vocab_size", "vocab")):
            shape = self.costs.meta.get("input_shape") or []
            seq = int(shape[1]) if len(shape) > 1 else int(entry.defaults.get("seq_len", 64))
            return {"kind": "bytes-lm", "seq_len": seq}
        return {"kind": "digits"}

    def launch(self, **overrides: Any):
        """Launch the current partition as a real job (``launch_backend``) and show its monitor."""
        from IPython.display import display

        from ..jobs import LaunchSpec, launch

        if self.costs.model not in _zoo_names():
            raise ValueError(f"model {self.costs.model!r} is not in the zoo, so no job can build it; "
                             f"launch a zoo model ({', '.join(_zoo_names())})")
        config = self.run_config(**overrides)
        self.job = launch(LaunchSpec(config=config, run_root=self.run_root, name=config.name),
                          backend=self.launch_backend)
        if self.monitor is not None:  # the previous launch's view goes away: stop refreshing it
            self.monitor.stop()
        self.launch_output.clear_output()
        with self.launch_output:
            if self.launch_backend == "dryrun":
                print("\n".join(self.job.commands))
            else:
                self.monitor = self.job.monitor()
                display(self.monitor)
        return self.job

    def _on_launch(self) -> None:
        self.launch_button.disabled = True
        try:
            self.launch()
        except ValueError as error:
            self._show_error(error)
        finally:
            self.launch_button.disabled = False
