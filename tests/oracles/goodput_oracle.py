#!/usr/bin/env python3
"""Google ml-goodput-measurement oracle for tessera's goodput calculator.

Writes tests/oracles/goldens/goodput_oracle.json. For each committed tessera event log
(tests/goodput/fixtures/*.jsonl) the events are translated into the entries
ml-goodput-measurement's GoodputRecorder would have written (job start per attempt,
TPU init, training preparation, data loading, step starts, custom badput, and Orbax-style
checkpoint-manager save/restore records), served to its GoodputCalculator through an
in-memory logger object (no Cloud Logging), and its goodput and badput breakdown (% of
the job's total time) are stored. tests/goodput/test_goodput_oracle.cpp compares
tessera's figures with them (0.5 percentage points; docs/goodput.md says which
categories differ by design and how they are compared).

Translation (tessera event -> reference entry):
  job_start, attempt_start (attempt > 0)   -> job_start_time (a restart)
  job_end                                  -> job_end_time
  backend_init_start/end                   -> tpu_init_start/end_time
  compile_start/end                        -> training_prep_start/end_time
  data_wait_start/end                      -> data_loading_start/end_time
  step_start                               -> step_start_time + step_count
  eval_start/end                           -> custom badput event 'EVAL'
  custom_badput_start/end                  -> custom badput event of that type
  checkpoint_save blocking part            -> checkpoint 'save' record (blocking seconds)
  checkpoint_restore_start/end             -> checkpoint 'restore' record (seconds)

Run through tests/oracles/run_oracle.sh goodput_oracle (pinned venv, live diff).
Usage: goodput_oracle.py OUT.json
"""
import datetime
import json
import os
import sys
import tempfile

from ml_goodput_measurement.src import goodput

GENERATOR = "tests/oracles/goodput_oracle.py"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = ["clean_run", "restarts_run"]


class InMemoryLogger:
    """The logger object GoodputRecorder/GoodputCalculator accept instead of Cloud Logging."""

    def __init__(self):
        self.entries = []

    def write_cloud_logging_entry(self, entry):
        self.entries.append(entry)

    def flush(self):
        pass

    def read_cloud_logging_entries(self, start_time=None, end_time=None, last_entry_info=None):
        if last_entry_info is not None:  # everything was returned by the first read
            return [], last_entry_info
        last = datetime.datetime.fromtimestamp(max(_entry_time(e) for e in self.entries), datetime.timezone.utc)
        return list(self.entries), (last, "last")


def _entry_time(entry):
    return next(v for k, v in entry.items() if "time" in k)


def _utc(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc)


def translate(events, logger, job):
    rec = goodput.GoodputRecorder(job, "tessera", logging_enabled=True, cloud_logger=logger)
    open_save, open_restore = {}, None
    for e in events:
        typ, t = e["type"], e["t"]
        if typ == "job_start" or (typ == "attempt_start" and e.get("attempt", 0) > 0):
            rec.record_job_start_time(_utc(t))
        elif typ == "job_end":
            rec.record_job_end_time(_utc(t))
        elif typ == "backend_init_start":
            rec.record_tpu_init_start_time(_utc(t))
        elif typ == "backend_init_end":
            rec.record_tpu_init_end_time(_utc(t))
        elif typ == "compile_start":
            rec.record_training_preparation_start_time(_utc(t))
        elif typ == "compile_end":
            rec.record_training_preparation_end_time(_utc(t))
        elif typ == "data_wait_start":
            rec.record_data_loading_start_time(_utc(t))
        elif typ == "data_wait_end":
            rec.record_data_loading_end_time(_utc(t))
        elif typ == "step_start":
            rec.record_step_start_time(e["step"], _utc(t))
        elif typ in ("eval_start", "custom_badput_start"):
            rec.record_custom_badput_event_start_time(_utc(t), e.get("badput_type", "eval"))
        elif typ in ("eval_end", "custom_badput_end"):
            rec.record_custom_badput_event_end_time(_utc(t), e.get("badput_type", "eval"))
        elif typ == "checkpoint_save_start" and e.get("part") == "blocking":
            open_save[e["step"]] = t
        elif typ == "checkpoint_save_end" and e.get("part") == "blocking" and e["step"] in open_save:
            start = open_save.pop(e["step"])
            # Orbax CheckpointManager's save record; the first key with "time" dates it.
            logger.write_cloud_logging_entry({
                "checkpoint_manager_blocking_start_time": start,
                "step": e["step"], "event_type": "save", "directory": "/local/ckpt",
                "wait_for_prev_duration_secs": 0.0, "checkpointer_blocking_duration_secs": t - start,
                "get_old_steps_duration_secs": 0.0, "checkpoint_manager_blocking_duration_secs": t - start,
            })
        elif typ == "checkpoint_restore_start":
            open_restore = t
        elif typ == "checkpoint_restore_end" and open_restore is not None:
            logger.write_cloud_logging_entry({
                "checkpoint_manager_start_time": open_restore,
                "step": e["step"], "event_type": "restore", "directory": "/local/ckpt",
                "checkpointer_duration_secs": t - open_restore, "checkpoint_manager_duration_secs": t - open_restore,
            })
            open_restore = None


def evaluate(name):
    with open(os.path.join(ROOT, "tests/goodput/fixtures", name + ".jsonl")) as f:
        events = [json.loads(line) for line in f if line.strip()]
    events.sort(key=lambda e: e["t"])
    logger = InMemoryLogger()
    translate(events, logger, "tessera-" + name)
    with tempfile.TemporaryDirectory() as cache:
        calc = goodput.GoodputCalculator("tessera-" + name, "tessera", cloud_logger=logger, cache_dir=cache)
        goodput_pct, badput, last_step = calc.get_job_goodput(include_badput_breakdown=True)
    breakdown = {}
    for kind, value in badput.items():
        if isinstance(value, dict):
            for sub, v in sorted(value.items()):
                breakdown[kind.name + ":" + sub] = float(v)
        else:
            breakdown[kind.name] = float(value)
    return {"goodput_percent": float(goodput_pct), "badput_percent": dict(sorted(breakdown.items())),
            "max_productive_step": int(last_step), "entries": len(logger.entries)}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    from importlib.metadata import version
    out = {"generator": GENERATOR, "reference": "ml-goodput-measurement " + version("ml-goodput-measurement"),
           "cases": {name: evaluate(name) for name in FIXTURES}}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
