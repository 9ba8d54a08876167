"""nightshift_progress: the training metrics Nightshift watches, served from the training process.

    import nightshift_progress

    progress = nightshift_progress.start("llama-7b")   # serves :9464/metrics (NIGHTSHIFT_PROGRESS_PORT)
    logging.getLogger().addHandler(progress.log_handler())  # error lines → training_errors_total{error_class}
    progress.resumed(step=checkpoint_step)             # after loading a checkpoint
    for batch in data:
        ...
        progress.step(samples=len(batch))
        progress.loss(loss.item())
        if step % 1000 == 0:
            with progress.checkpointing():
                save_checkpoint()
    progress.close()                                   # serves on: linger s, and until the last change is scraped

Framework callbacks: :mod:`nightshift_progress.hf` (Hugging Face Trainer) and :mod:`nightshift_progress.lightning`
(PyTorch Lightning), each importing its framework only when imported itself.
"""

from nightshift_progress.classify import ERROR_CLASSES, Classifier, packaged_classifier
from nightshift_progress.identity import LABELS, Identity, identity_from_env
from nightshift_progress.progress import (
    DEFAULT_LINGER_SECONDS,
    DEFAULT_PORT,
    ErrorLineHandler,
    Progress,
    start,
)

__all__ = [
    "DEFAULT_LINGER_SECONDS",
    "DEFAULT_PORT",
    "ERROR_CLASSES",
    "LABELS",
    "Classifier",
    "ErrorLineHandler",
    "Identity",
    "Progress",
    "identity_from_env",
    "packaged_classifier",
    "start",
]
