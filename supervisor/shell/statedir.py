"""The names this module had before it was split, for code written against it (another branch of
this round); new code imports from the three modules below. Remove once nothing imports it.

* :mod:`supervisor.shell.statefiles`: the one door to the disk (every open of a state file);
* :mod:`supervisor.shell.locks`: one guard per state dir, GPU start-up turns;
* :mod:`supervisor.shell.learned`: the learned store.
"""

from supervisor.errors import AlreadyRunning, StateError, UnsafeDir
from supervisor.shell.learned import LEARNED, MEASURED_PREFIX, LearnedStore, StoreKeys, learned_facts, learned_key
from supervisor.shell.locks import (
                                      GUARD_INFO,
                                      GUARD_LOCK,
                                      GpuTurn,
                                      GpuTurnTimeout,
                                      StateDirLock,
                                      gpu_lock_dir,
                                      gpu_turn,
                                      gpu_turn_async,
                                      is_running,
)
from supervisor.shell.statefiles import (
                                      MAX_STATE_FILE,
                                      atomic_write,
                                      ensure_dir,
                                      read_json,
                                      set_aside,
                                      write_json,
)
from supervisor.shell.statelog import read_lines

__all__ = ["AlreadyRunning", "GUARD_INFO", "GUARD_LOCK", "GpuTurn", "GpuTurnTimeout", "LEARNED", "LearnedStore",
           "MAX_STATE_FILE", "MEASURED_PREFIX", "StateDirLock", "StateError", "StoreKeys", "UnsafeDir",
           "atomic_write", "ensure_dir", "gpu_lock_dir", "gpu_turn", "gpu_turn_async", "is_running",
           "learned_facts", "learned_key", "read_json", "read_lines", "set_aside", "write_json"]
