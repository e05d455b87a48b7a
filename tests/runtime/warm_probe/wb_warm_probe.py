"""A rank stand-in for the warm server's tests: prints who it is, then sleeps or exits as its arguments say."""

import os
import sys
import time

import torch

print(f"probe pid={os.getpid()} mark={os.environ.get('PROBE_MARK')} threads={torch.get_num_threads()} "
      f"seed={torch.initial_seed()} cwd={os.getcwd()} argv={sys.argv[1:]}", flush=True)
action = sys.argv[1] if len(sys.argv) > 1 else "exit"
if action == "sleep":
    time.sleep(60)
elif action == "raise":
    raise RuntimeError("the probe failed on purpose")
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
