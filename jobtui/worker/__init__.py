"""The worker and its parts (see worker.py)."""

from .completer import OutcomeWriter
from .config import default_worker_id
from .executor import InFlight
from .outcome import MAX_UNCOUNTED_IN_A_ROW, Outcome
from .worker import Worker

__all__ = ["MAX_UNCOUNTED_IN_A_ROW", "InFlight", "Outcome", "OutcomeWriter", "Worker", "default_worker_id"]
