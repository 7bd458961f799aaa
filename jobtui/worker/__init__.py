"""The worker and its parts (see worker.py)."""

from jobtui.worker.completer import OutcomeWriter
from jobtui.worker.config import default_worker_id
from jobtui.worker.executor import InFlight
from jobtui.worker.outcome import MAX_UNCOUNTED_IN_A_ROW, Outcome
from jobtui.worker.worker import Worker

__all__ = ["MAX_UNCOUNTED_IN_A_ROW", "InFlight", "Outcome", "OutcomeWriter", "Worker", "default_worker_id"]
