"""The training stack from Python: models, optimizer, schedules, checkpoints, tokenizers,
the Trainer (with resume), and the goodput Recorder from a plain Python loop."""

import json
import os

import numpy as np
import pytest

import tessera as ts

SMALL = {"preset": "tiny", "dim": 64, "layers": 2, "heads": 2, "context": 32}


@pytest.fixture
def model():
    return ts.models.Model(**SMALL)


def batch(model, seed=0, b=4, t=16):
    ids = np.random.default_rng(seed).integers(0, model.vocab, (b, t + 1)).astype(np.int32)
    return ts.array(ids[:, :-1]), ts.array(ids[:, 1:])


def test_model_init_is_deterministic_and_loss_is_log_vocab_at_start(model):
    p1, p2 = model.init(seed=3), model.init(seed=3)
    for a, b in zip(ts.tree_util.tree_leaves(p1), ts.tree_util.tree_leaves(p2)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    x, y = batch(model)
    assert float(model.loss(p1, x, y)) == pytest.approx(np.log(model.vocab), rel=0.05)
    assert model.logits(p1, x).shape == (4, 16, model.vocab)
    assert model.parameter_count == sum(a.size for a in ts.tree_util.tree_leaves(p1)) - 0  # vocab 256: no padding
    assert "tiny" in ts.models.preset_names()
    with pytest.raises(ValueError, match="dim"):
        ts.models.Model("tiny", dimm=3)


def test_packed_documents_see_only_themselves(model):
    params = model.init(1)
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, model.vocab, n).astype(np.int32) for n in (7, 9)]
    tokens = ts.array(np.concatenate(docs)[None, :])
    segments = ts.array(np.array([[1] * 7 + [2] * 9], dtype=np.int32))
    positions = ts.models.document_positions(segments)
    assert np.asarray(positions).tolist() == [list(range(7)) + list(range(9))]
    packed = np.asarray(model.logits(params, tokens, segment_ids=segments))
    plain = np.asarray(model.logits(params, tokens))
    start = 0
    for doc in docs:
        alone = np.asarray(model.logits(params, ts.array(doc[None, :])))[0]
        np.testing.assert_allclose(packed[0, start:start + len(doc)], alone, rtol=1e-4, atol=1e-5)
        if start:  # without packing the second document sees the first
            assert not np.allclose(plain[0, start:start + len(doc)], alone, rtol=1e-2, atol=1e-2)
        start += len(doc)
    # The loss: targets of -100 where the next token is another document's.
    targets = np.concatenate([np.append(d[1:], -100) for d in docs]).astype(np.int32)[None, :]
    alone_losses = [float(model.loss(params, ts.array(d[None, :-1]), ts.array(d[None, 1:]))) for d in docs]
    expected = sum(loss * (len(d) - 1) for loss, d in zip(alone_losses, docs)) / sum(len(d) - 1 for d in docs)
    loss = ts.jit(model.loss)(params, tokens, ts.array(targets), None, segments, positions)  # positions given under jit
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="both segment_ids and positions"):
        model.logits(params, tokens, positions=positions)
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        ts.models.document_positions(ts.array(np.ones(4, dtype=np.int32)))


def test_jitted_training_loop_from_python_learns(model):
    params = model.init(0)
    opt = ts.optim.Optimizer(model, weight_decay=0.0, clip_norm=1.0)
    state = opt.init(params)
    x, y = batch(model)

    @ts.jit
    def step(params, state, x, y, lr):
        loss, grads = ts.value_and_grad(model.loss)(params, x, y)
        params, state, norm = opt.apply(params, grads, state, lr)
        return params, state, loss, norm

    losses = []
    for i in range(8):
        params, state, loss, norm = step(params, state, x, y, ts.array(3e-3))
        losses.append(float(loss))
    assert step.trace_count == 1
    assert losses[-1] < losses[0] - 0.5, losses
    assert int(state["step"]) == 8


def test_every_optimizer_from_python(model):
    params = model.init(0)
    x, y = batch(model)
    losses = {}
    for name in ("adamw", "sgd", "lion", "adafactor", "muon"):
        opt = ts.optim.Optimizer(model, name=name, adafactor_min_dim_to_factor=16)
        state = opt.init(params)

        @ts.jit
        def step(p, s):
            loss, g = ts.value_and_grad(model.loss)(p, x, y)
            p, s, _ = opt.apply(p, g, s, ts.array(1e-2 if name != "sgd" else 0.1))
            return p, s, loss

        p, s = params, state
        for _ in range(4):
            p, s, loss = step(p, s)
        losses[name] = float(model.loss(p, x, y))
    start = float(model.loss(params, x, y))
    for name, loss in losses.items():
        assert loss < start, (name, loss, start)
    with pytest.raises(ValueError, match="lamb"):
        ts.optim.Optimizer(model, name="lamb")


def test_schedule_and_clipping():
    assert ts.optim.learning_rate(0, peak_lr=1.0, warmup_steps=4) == pytest.approx(0.25)
    assert ts.optim.learning_rate(1000, peak_lr=1.0, total_steps=1000, min_lr_ratio=0.1) == pytest.approx(0.1)
    assert ts.optim.learning_rate(7, peak_lr=2.0, decay="constant") == 2.0
    assert ts.optim.learning_rate(50, peak_lr=1.0, decay="wsd", total_steps=100) == 1.0
    assert ts.optim.learning_rate(90, peak_lr=1.0, decay="wsd", total_steps=100, min_lr_ratio=0.0) == pytest.approx(0.5)
    grads = {"a": ts.full((4,), 3.0), "b": [ts.full((9,), 1.0)]}
    assert float(ts.optim.global_norm(grads)) == pytest.approx(np.sqrt(36 + 9))
    clipped, norm = ts.optim.clip_by_global_norm(grads, 1.0)
    assert float(ts.optim.global_norm(clipped)) == pytest.approx(1.0, rel=1e-6)
    p, m, v = ts.optim.adamw_update(ts.ones(3), ts.ones(3), ts.zeros(3), ts.zeros(3), ts.array(0.1), ts.array(1))
    np.testing.assert_allclose(np.asarray(p), 0.9, rtol=1e-5)


def test_checkpoints(tmp_path, model):
    params = model.init(1)
    ts.checkpoints.save(tmp_path / "p.safetensors", params)
    loaded = ts.checkpoints.load(tmp_path / "p.safetensors")
    assert loaded["wte"].shape == params["wte"].shape
    want = dict(zip(ts.tree_util.tree_paths(params), ts.tree_util.tree_leaves(params)))
    assert sorted(loaded) == sorted(want)
    for name, value in want.items():
        assert np.asarray(loaded[name]).tobytes() == np.asarray(value).tobytes(), name
    manager = ts.checkpoints.CheckpointManager(tmp_path / "run", keep_last=2)
    for step in (1, 2, 3):
        path = manager.save(step, params, {"step": ts.array(step)})
    assert manager.steps() == [2, 3]
    assert ts.checkpoints.verify(path) == (True, "")
    step, restored, opt = manager.restore_latest(params, {"step": ts.array(0)})
    assert step == 3 and int(opt["step"]) == 3
    # a damaged newest checkpoint is skipped with a warning, never loaded
    with open(os.path.join(path, "params.safetensors"), "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"\0\0\0\1")
    with pytest.warns(UserWarning, match="checksum"):
        step, _, _ = manager.restore_latest(params, {"step": ts.array(0)})
    assert step == 2


def test_tokenizer():
    tok = ts.tokenizer("byte")
    assert tok.vocab_size == 256 and tok.decode(tok.encode("héllo")) == "héllo"
    with pytest.raises(Exception, match="nope"):
        ts.tokenizer("spm:/nope/tokenizer.model")


def trainer_config(tmp_path, steps):
    text = tmp_path / "text"
    text.mkdir(parents=True, exist_ok=True)
    (text / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 400)
    return {
        "model": SMALL,
        "data": {"train": str(tmp_path / "train.bin"), "val": str(tmp_path / "val.bin"), "sources": [str(text)],
                 "tokenizer": "byte"},
        "optimizer": {"lr": 3e-3},
        "train": {"steps": steps, "batch": 4, "seq": 16, "eval_interval": 0, "log_interval": 1},
        "checkpoint": {"interval": 0},
        "run": {"dir": str(tmp_path / "run"), "threads": 1, "tensorboard": False},
    }


def test_trainer_fit_resume_is_bitwise_and_records_goodput(tmp_path):
    straight = ts.train.Trainer(trainer_config(tmp_path / "a", 6))
    seen = []
    summary = straight.fit(callback=seen.append)
    assert seen == [1, 2, 3, 4, 5, 6] and summary["end_step"] == 6 and summary["stop_reason"] == "steps"
    # AdamW: two float32 moments per parameter and the int64 step count
    assert summary["optimizer"] == "adamw"
    assert summary["optimizer_state_bytes"] == 8 * summary["parameters"] + 8

    first = ts.train.Trainer(trainer_config(tmp_path / "b", 6))
    first.fit(stop_at_step=3)
    resumed = ts.train.Trainer(trainer_config(tmp_path / "b", 6))
    summary = resumed.fit()
    assert summary["start_step"] == 3 and summary["end_step"] == 6
    for a, b in zip(ts.tree_util.tree_leaves(straight.params), ts.tree_util.tree_leaves(resumed.params)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    report = ts.goodput.report_dict(tmp_path / "b" / "run")
    assert len(report["attempts"]) == 2 and report["kept_steps"] == 6 and report["finished"] is True
    assert ts.goodput.report(tmp_path / "b" / "run").startswith("goodput [")
    with pytest.raises(ts.ConfigError, match="train.stepz"):
        ts.train.Trainer(trainer_config(tmp_path / "c", 1), ["train.stepz=3"])


def test_goodput_recorder_from_a_plain_python_loop(tmp_path):
    run = tmp_path / "loop"
    rec = ts.goodput.Recorder(run)
    with rec.job("python-loop"):
        with rec.phase("compile"):
            pass
        for i in range(3):
            with rec.phase("data_wait"):
                pass
            with rec.step(i, tokens=128, model_flops=1e6):
                pass
        with rec.phase("checkpoint_save", step=2):
            pass
        with rec.phase("my_badput"):
            pass
    events = [json.loads(line) for line in (run / "goodput" / "events.jsonl").read_text().splitlines()]
    types = [e["type"] for e in events]
    assert types[0] == "job_start" and types[-1] == "job_end"
    assert types.count("step_end") == 3 and "compile_end" in types and "custom_badput_start" in types
    report = ts.goodput.report_dict(run)
    assert report["finished"] is True and report["job"] == "python-loop"
    assert report["kept_steps"] == 3 and report["tokens"] == 3 * 128
    assert set(report["seconds"]) >= {"productive", "compile", "data_loading", "checkpoint_save", "custom"}
    assert report["custom_seconds"].keys() == {"my_badput"}
    assert ts.goodput.report(run).startswith("goodput [python-loop]")
    # a failing job is recorded as such, and the exception still propagates
    rec2 = ts.goodput.Recorder(tmp_path / "failing")
    with pytest.raises(RuntimeError):
        with rec2.job("bad"):
            raise RuntimeError("boom")
    text = (tmp_path / "failing" / "goodput" / "events.jsonl").read_text()
    assert "boom" in text and '"failure"' in text


def test_ctrl_c_during_fit_checkpoints_and_raises_keyboard_interrupt(tmp_path):
    import signal

    config = trainer_config(tmp_path, 8)
    trainer = ts.train.Trainer(config)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when the tests run in the background

    def interrupt(step):
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C

    with pytest.raises(KeyboardInterrupt, match="checkpoint saved"):
        trainer.fit(callback=interrupt)
    assert trainer.summary["end_step"] in (2, 3)
    resumed = ts.train.Trainer(config).fit()
    assert resumed["start_step"] == trainer.summary["end_step"] and resumed["end_step"] == 8
    # Python's own Ctrl-C handling (whatever it was) is back after fit()
    assert signal.getsignal(signal.SIGINT) is before


def test_nn_modules(rng):
    x_np = rng.standard_normal((4, 3)).astype(np.float32)
    lin = ts.nn.Linear(3, 2)
    p = lin.init(seed=0)
    np.testing.assert_allclose(np.asarray(lin(p, x_np)), x_np @ np.asarray(p["w"]) + np.asarray(p["b"]), rtol=1e-5)
    assert lin.param_specs()["w"] == {"shape": (3, 2), "axes": ("embed", "mlp"), "kind": "weight", "init": "normal(0.02)"}
    assert np.asarray(lin.init(seed=0)["w"]).tobytes() == np.asarray(p["w"]).tobytes()
    assert np.asarray(lin.init(seed=0, name="proj")["w"]).tobytes() != np.asarray(p["w"]).tobytes()
    assert ts.nn.Linear(3, 2, bias=False).init().keys() == {"w"}

    ln = ts.nn.LayerNorm(3)
    pl = ln.init()
    np.testing.assert_allclose(np.asarray(ln(pl, x_np)), np.asarray(ts.nn.layer_norm(x_np, pl["scale"], pl["bias"])),
                               rtol=1e-6)
    rms = ts.nn.RMSNorm(3)
    assert rms(rms.init(), x_np).shape == (4, 3) and rms.param_specs()["scale"]["kind"] == "norm"

    emb = ts.nn.Embedding(10, 4)
    pe = emb.init(seed=2)
    ids = np.array([[1, 9], [0, 1]], dtype=np.int32)
    np.testing.assert_array_equal(np.asarray(emb(pe, ids)), np.asarray(pe["w"])[ids])
    np.testing.assert_allclose(np.asarray(emb.attend(pe, np.ones((2, 4), np.float32))),
                               np.ones((2, 4)) @ np.asarray(pe["w"]).T, rtol=1e-5)

    for mlp in (ts.nn.GeluMLP(4, 8), ts.nn.SwiGLU(4, 8)):
        pm = mlp.init(seed=1)
        assert mlp(pm, np.ones((2, 4), np.float32)).shape == (2, 4)

    att = ts.nn.Attention(16, 4, kv_heads=2, rope=True)
    pa = att.init(seed=1)
    xa = rng.standard_normal((2, 5, 16)).astype(np.float32)
    y = np.asarray(att(pa, xa))
    assert y.shape == (2, 5, 16)
    # causal: the first position's output does not depend on later positions
    xb = xa.copy()
    xb[:, 3:] += 1.0
    np.testing.assert_allclose(np.asarray(att(pa, xb))[:, :3], y[:, :3], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="heads"):
        ts.nn.Attention(16, 3)

    drop = ts.nn.Dropout(0.5)
    kept = np.asarray(drop(ts.ones(1000), ts.random.key(0)))
    assert set(np.unique(kept)) == {0.0, 2.0} and 400 < (kept > 0).sum() < 600
    np.testing.assert_array_equal(np.asarray(drop(ts.ones(5))), np.ones(5))

    g = ts.grad(lambda params: ts.sum(lin(params, x_np) ** 2))(p)
    want = 2 * x_np.T @ (x_np @ np.asarray(p["w"]) + np.asarray(p["b"]))
    np.testing.assert_allclose(np.asarray(g["w"]), want, rtol=1e-5, atol=1e-6)
