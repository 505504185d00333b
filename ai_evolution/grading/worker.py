"""Worker entry point: ``python -m ai_evolution.grading.worker`` (job on stdin; see ``sandbox``)."""

import sys

from .sandbox import worker_main

if __name__ == "__main__":
    sys.exit(worker_main())
