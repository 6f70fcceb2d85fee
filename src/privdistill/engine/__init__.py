"""The machinery every method shares: environment, run directories, checkpoints, training loops."""

from privdistill.engine.context import Env
from privdistill.engine.run import RunDir, record_result
from privdistill.engine.trainer import TrainResult, evaluate, predict_logits, train_classifier

__all__ = ["Env", "RunDir", "TrainResult", "evaluate", "predict_logits", "record_result", "train_classifier"]
