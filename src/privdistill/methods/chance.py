"""Whether a released model answers at chance, or misses a class, said wherever its accuracy is said.

A model whose held-out accuracy is no better than always answering the test set's largest class, or that answers
one class for most inputs, has learned (almost) nothing; a run that ends there is a failed run, not a result. The
rule (RULE) is stated with the numbers in the run's summary (`chance_check`); a run at chance gets `at_chance`
true and a `warning` first in its summary, the first line of the command line's summary, of the run and privacy
reports and of the model card, and `export` refuses it unless told (`--allow-chance`, allow_chance=True).

A model above chance can still miss a class it never learned (a DPDFD run whose generator never showed the student
a "1": 16.5 % of the test's ones recognised, 89-97 % of every other digit; docs/research-log.md): its accuracy alone
reads as a fair result. The check records each class's recall (`class_recall`) and names a class far below the
median one (MISSED_RULE) in the same `warning`; such a model is exported (it answers the other classes), its card
says which class it misses.
"""

from __future__ import annotations

import math
import statistics
import warnings
from typing import Any

import torch

from privdistill.engine.trainer import predict_logits
from privdistill.errors import ConfigError

#: the least margin above the largest class's share that counts as learning something (3 points)
CHANCE_MARGIN = 0.03
#: a model answering one class for more than this share of the test inputs answers that class, not the input
ONE_CLASS_SHARE = 0.8

#: a class is missed when its recall is below this share of the median class's recall...
MISSED_SHARE = 0.5
#: ...judged only for classes with this many test records (fewer: too noisy to call)
MIN_CLASS_RECORDS = 20

RULE = (f"at chance when the held-out accuracy is below the largest class's share of the test set plus "
        f"max({CHANCE_MARGIN * 100:g} points, 2 binomial standard errors), or when the model answers one class for "
        f"more than {ONE_CLASS_SHARE:.0%} of the test inputs (beyond that class's own share plus the same margin)")


MISSED_RULE = (f"a class is missed when its recall on the test set is below {MISSED_SHARE:.0%} of the median class's "
               f"(classes with at least {MIN_CLASS_RECORDS} test records)")


class ChanceWarning(UserWarning):
    """A released model answers at chance (see privdistill.methods.chance.RULE)."""


class MissedClassWarning(ChanceWarning):
    """A released model above chance misses a class (see privdistill.methods.chance.MISSED_RULE)."""


def chance_check(predictions: torch.Tensor, labels: torch.Tensor, num_classes: int,
                 classes: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    """The rule applied to a model's held-out answers: the numbers, `at_chance`, and the sentence that says so
    (`warning`, None when the model is above chance)."""
    predictions, labels = predictions.reshape(-1).long().cpu(), labels.reshape(-1).long().cpu()
    n = len(labels)
    if n == 0:
        return {"at_chance": False, "rule": RULE, "test_records": 0, "warning": None}
    k = max(num_classes, int(labels.max()) + 1, int(predictions.max()) + 1)
    counts = torch.bincount(labels, minlength=k)
    truth = counts.double() / n
    answered = torch.bincount(predictions, minlength=k).double() / n
    majority, top = int(truth.argmax()), int(answered.argmax())
    share, top_share = float(truth[majority]), float(answered[top])
    accuracy = float((predictions == labels).double().mean())
    margin = max(CHANCE_MARGIN, 2 * math.sqrt(share * (1 - share) / n))
    threshold = share + margin
    near = accuracy < threshold
    one_class = top_share > ONE_CLASS_SHARE and top_share > float(truth[top]) + margin
    at_chance = near or one_class

    def name(c: int) -> str:
        return f"'{classes[c]}'" if c < len(classes) else str(c)

    hits = torch.bincount(labels[predictions == labels], minlength=k)
    recall = [float(hits[c]) / int(counts[c]) if counts[c] >= MIN_CLASS_RECORDS else None for c in range(k)]
    warning = finding = None
    if at_chance:
        why = []
        if near:
            why.append(f"its held-out accuracy {accuracy:.1%} is below {threshold:.1%}, the largest class's share "
                       f"({name(majority)}, {share:.1%} of the {n} test images) plus {margin * 100:.1f} points")
        if one_class:
            why.append(f"it answers class {name(top)} for {top_share:.0%} of the test inputs")
        finding = f"AT CHANCE: this model has learned (almost) nothing: {'; '.join(why)}"
        warning = (f"{finding}. Try a larger epsilon, another recipe (privdistill recipes) or method; `export` "
                   "refuses it unless --allow-chance")
    judged = [r for r in recall if r is not None]
    median = statistics.median_low(judged) if len(judged) >= 3 else None
    missed = [] if at_chance or median is None else [c for c, r in enumerate(recall)
                                                     if r is not None and r < MISSED_SHARE * median]
    if missed:
        which = ", ".join(f"class {name(c)} in {recall[c]:.1%} of its {int(counts[c])} test images" for c in missed)
        finding = (f"MISSED CLASS{'ES' if len(missed) > 1 else ''}: this model recognises {which}, against "
                   f"{median:.1%} for the median class")
        warning = (f"{finding}; its accuracy ({accuracy:.1%}) hides that. Another run, a larger epsilon or another "
                   "recipe (privdistill recipes) may recover it")
    return {"at_chance": at_chance, "rule": RULE, "test_records": n, "accuracy": round(accuracy, 4),
            "majority_class": majority, "majority_share": round(share, 4), "threshold": round(threshold, 4),
            "top_answer": top, "top_answer_share": round(top_share, 4),
            "class_recall": [None if r is None else round(r, 4) for r in recall], "missed_rule": MISSED_RULE,
            "missed_classes": missed, **({"finding": finding} if warning else {}), "warning": warning}


def evaluate_release(model: torch.nn.Module, test, env) -> tuple[float, dict[str, Any]]:
    """The released model's held-out accuracy on `test` (an ImageDataset) and the summary fields of the chance
    check (`at_chance`, `chance_check`, and `warning` first when at chance or missing a class, also raised as a
    ChanceWarning or MissedClassWarning)."""
    if len(test) == 0:
        return float("nan"), {}
    predictions = predict_logits(model, test.images, env).argmax(1)
    accuracy = float((predictions == test.labels).float().mean())
    check = chance_check(predictions, test.labels, test.num_classes, test.classes)
    warning = check.pop("warning")
    fields: dict[str, Any] = {"at_chance": check["at_chance"], "chance_check": check}
    if warning:
        fields["warning"] = warning
        warnings.warn(warning, MissedClassWarning if check["missed_classes"] else ChanceWarning, stacklevel=2)
    return accuracy, fields


def given_teacher_accuracy(model: torch.nn.Module, test, env, *, named: str, refuse: bool) -> float:
    """A teacher the user brings (DPDFD), on the test split as it is fed here: its accuracy, refused (`refuse`, else
    a ChanceWarning) before any step when at chance by this module's rule: DPDFD passes on only what the teacher
    knows, and the usual cause is a teacher trained on another input scale than the [-1, 1] it is fed."""
    if len(test) == 0:
        return float("nan")
    predictions = predict_logits(model, test.images, env).argmax(1)
    check = chance_check(predictions, test.labels, test.num_classes, test.classes)
    if check["at_chance"]:
        message = (f"the teacher ({named}) is at chance on the {check['test_records']} test images: "
                   f"{check['accuracy']:.1%} right (largest class {check['majority_share']:.1%}); DPDFD passes on only "
                   "what the teacher knows. It is fed images scaled to [-1, 1] (x / 127.5 - 1): if it was trained on "
                   "another scale, say which (--teacher-range 0,1; Python: TeacherSpec(module=..., input_range=(0, "
                   "1))); a teacher that expects normalised inputs can be wrapped with its normalisation in Python "
                   "and saved for --teacher-module. (--set run.plan_check=warn runs it all the same)")
        if refuse:
            raise ConfigError(message)
        warnings.warn(message, ChanceWarning, stacklevel=2)
    return float((predictions == test.labels).float().mean())

