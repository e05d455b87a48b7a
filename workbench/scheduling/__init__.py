"""Pipeline schedules as data: generators, passes, validation, timed simulation, memory (pure Python).

``registry`` binds every pipeline kind to its generator and turns a plan
into its schedule (``schedule_for``); ``generators`` and ``zero_bubble``
write every schedule once as per-rank action lists;
``passes`` lowers them (sends/receives, gradient sync, weight stashing);
``validate`` proves a schedule can run; ``simulate`` times it on a cluster
and returns the same events the runtime records; ``memory`` and
``stagecosts`` hold the memory and per-stage cost models they share.
"""

from .generators import async_1f1b, data_parallel, gpipe, gropipe, interleaved, one_f_one_b, tensor2d_step
from .passes import add_grad_sync, add_p2p, add_weight_stash, lower
from .registry import ScheduleRequest, register, schedule_for, stage_memory
from .simulate import SimResult, simulate
from .stagecosts import StageCosts
from .validate import ScheduleError, validate

__all__ = [
    "gpipe", "one_f_one_b", "interleaved", "async_1f1b", "gropipe", "data_parallel", "tensor2d_step",
    "add_p2p", "add_grad_sync", "add_weight_stash", "lower", "validate", "ScheduleError", "simulate", "SimResult",
    "StageCosts", "schedule_for", "stage_memory", "register", "ScheduleRequest",
]
