import torch

from avatar_render.models.sampler import SamplerConfig, guide, passes, sample, timesteps


def test_timesteps_shifted_and_ordered():
    ts = timesteps(SamplerConfig(steps=4, shift=5.0))
    assert ts.shape == (5,) and ts[0] == 1000 and ts[-1] == 0
    assert torch.all(ts[:-1] > ts[1:])
    s = 1 - 1 / 3  # the second of linspace(1, 0.001, 4), roughly
    assert abs(float(ts[1]) / 1000 - 5 * s / (1 + 4 * s)) < 2e-3
    assert torch.allclose(timesteps(SamplerConfig(steps=3, shift=1.0))[:3], torch.tensor([1000.0, 500.5, 1.0]))


def test_exact_flow_recovers_the_clean_sample():
    """With the true flow v = noise - x0, Euler integration lands on x0 for any schedule."""
    g = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(4, 3, 2, 2, generator=g), torch.randn(4, 3, 2, 2, generator=g)
    out = sample(SamplerConfig(steps=5, text_scale=1.0, audio_scale=1.0), noise=noise,
                 predict=lambda x, t, name: noise - x0, pin=lambda x: x)
    assert torch.allclose(out, x0, atol=1e-5)


def test_pinned_latents_stay_fixed_and_guidance_formula():
    fixed = torch.full((4, 1, 2, 2), 7.0)

    def pin(x):
        x = x.clone()
        x[:, :1] = fixed
        return x

    seen = []

    def predict(x, t, name):
        seen.append(name)
        assert torch.equal(x[:, :1], fixed)
        return {"cond": 3.0, "no_text": 2.0, "uncond": 1.0}[name] * torch.ones_like(x)

    cfg = SamplerConfig(steps=2, text_scale=5.0, audio_scale=4.0)
    out = sample(cfg, noise=torch.zeros(4, 3, 2, 2), predict=predict, pin=pin)
    assert torch.equal(out[:, :1], fixed)
    assert seen == ["cond", "no_text", "uncond"] * 2
    v = guide(cfg, {"cond": torch.tensor(3.0), "no_text": torch.tensor(2.0), "uncond": torch.tensor(1.0)})
    assert float(v) == 1 + 5 * (3 - 2) + 4 * (2 - 1)
    assert torch.allclose(out[:, 1:], torch.full_like(out[:, 1:], -float(v)))  # from 0, over the whole range
    assert passes(SamplerConfig(text_scale=1.0)) == ("cond", "no_audio")
