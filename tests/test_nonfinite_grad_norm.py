"""A gradient whose every value is finite but whose norm overflows float32 (where the optimizer computes it) is
a non-finite step like a NaN loss: skipped, counted, and a streak of them stops the run (exit 3)."""

import pytest
import torch


def test_a_gradient_norm_that_overflows_is_a_skipped_counted_step_and_its_streak_stops_the_run():
    """Before the fix the optimizer clipped such a gradient to nothing and the step counted as a good one: DPO at
    beta 1e30 trained nothing, saved the start's weights and exited 0."""
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.protocol import Experience, MiniBatch
    from mindspeed_rl.trainer.runtime.guards import NonFiniteStop, stop_on_nonfinite_steps
    from mindspeed_rl.utils import dist
    from mindspeed_rl.workers.base_worker import train_on_mini_batches
    from tests.helpers import make_batch, sft_loss, tiny_role

    dist.init_distributed()
    try:
        dist.init_model_parallel(seed=1)
        engine = MegatronEngine(tiny_role(), head="lm", trainable=True, total_steps=10)
        before = {k: v.clone() for k, v in engine.named_weights()}
        batch = make_batch(4, 12)
        rows = Experience(
            prompt_width=4,
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            response_mask=batch["attention_mask"][:, 4:],
        )

        def huge_loss(rows, normaliser):
            return lambda outputs, mb: (sft_loss(outputs, mb)[0] * 1e30, {})

        metrics = train_on_mini_batches(engine, [MiniBatch(rows, 1.0)] * 3, huge_loss, 2, "dpo")
        assert metrics["dpo/skipped_steps"] == 3 and metrics["dpo/nonfinite_streak"] == 3, metrics
        assert metrics["dpo/grad_norm"] == float("inf")  # the norm's square overflows float32
        assert all(torch.equal(before[k], v) for k, v in engine.named_weights())  # no step was taken
        with pytest.raises(NonFiniteStop, match="model's last 3 optimizer steps had a NaN/Inf loss or gradient"):
            stop_on_nonfinite_steps(metrics, 3, 1)
        metrics = train_on_mini_batches(
            engine, [MiniBatch(rows, 1.0)], lambda r, n: lambda o, mb: sft_loss(o, mb), 2, "dpo"
        )
        assert metrics["dpo/skipped_steps"] == 0 and metrics["dpo/nonfinite_streak"] == 0
        assert 0 < metrics["dpo/grad_norm"] < float("inf")
    finally:
        dist.destroy()


def test_fp16_overflows_lower_the_loss_scale_until_steps_go_through_without_counting_as_nonfinite():
    """An fp16 gradient that overflows the loss scale skips its step while the dynamic scale backs off (counted
    as skipped, not in the non-finite streak, which would stop the run), until a step goes through; a NaN loss
    still counts. Before the fix every step was skipped at the same scale and the streak stopped the run."""
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.utils import dist
    from tests.helpers import make_batch, sft_loss, tiny_role

    dist.init_distributed()
    try:
        dist.init_model_parallel(seed=1)
        engine = MegatronEngine(tiny_role(fp16=True), head="lm", trainable=True, total_steps=10)
        before = {k: v.clone() for k, v in engine.named_weights()}
        batch = make_batch(4, 12)
        scales, results = [float(engine.optimizer.get_loss_scale())], []
        while len(results) < 24 and not any(r.update_successful for r in results):
            # a loss 1000x larger overflows fp16 at the starting scale 2^16
            results.append(engine.train_step(batch, lambda outputs, mb: (sft_loss(outputs, mb)[0] * 1e3, {}), 2))
            scales.append(float(engine.optimizer.get_loss_scale()))
            assert engine.nonfinite_streak == 0
        assert results[0].skipped and results[-1].update_successful, [r.skipped for r in results]
        assert 0 < results[-1].grad_norm < float("inf")
        assert scales[-1] < scales[0] == 2.0**16 and scales == sorted(scales, reverse=True), scales
        assert any(not torch.equal(before[k], v) for k, v in engine.named_weights())
        nan_loss = engine.train_step(batch, lambda outputs, mb: (sft_loss(outputs, mb)[0] * float("nan"), {}), 2)
        assert nan_loss.skipped and engine.nonfinite_streak == 1
        scaler = engine.optimizer.chained_optimizers[0].grad_scaler
        scaler._scale.fill_(float(scaler.min_scale))  # at its floor an overflow is the run's, not the scale's
        huge = engine.train_step(batch, lambda outputs, mb: (sft_loss(outputs, mb)[0] * 1e30, {}), 2)
        assert huge.skipped and engine.nonfinite_streak == 2 and not huge.grad_norm < float("inf")
    finally:
        dist.destroy()


def test_the_split_step_takes_megatrons_own_step():
    """The engine's step (one norm for the check and the clipping) moves the weights exactly as megatron's
    ``optimizer.step()`` does, with clipping at work (bf16 and fp32)."""
    import mindspeed_rl.models.engine as engine_module
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.utils import dist
    from tests.helpers import make_batch, sft_loss, tiny_role

    def megatrons_step(optimizer, losses_finite, agree):
        stepped, grad_norm, _ = optimizer.step()
        return bool(stepped), float(grad_norm), False

    dist.init_distributed()
    try:
        for bf16 in (True, False):
            weights, norms = [], []
            for step in (engine_module.step_unless_nonfinite, megatrons_step):
                dist.init_model_parallel(seed=1)
                engine = MegatronEngine(tiny_role(bf16=bf16, clip_grad=0.05), head="lm", trainable=True, total_steps=10)
                original, engine_module.step_unless_nonfinite = engine_module.step_unless_nonfinite, step
                try:
                    results = [engine.train_step(make_batch(4, 12), sft_loss, 2) for _ in range(2)]
                finally:
                    engine_module.step_unless_nonfinite = original
                assert all(r.update_successful for r in results)
                norms.append([r.grad_norm for r in results])
                weights.append({k: v.clone() for k, v in engine.named_weights()})
            assert norms[0] == norms[1] and min(norms[0]) > 0.05, norms  # clipped
            assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    finally:
        dist.destroy()
