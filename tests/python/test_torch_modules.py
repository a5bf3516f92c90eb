"""qkv.torch's modules against torch.nn's: MultiheadAttention and the Transformer layers are drop-ins (same
parameters, state_dict and initialisation) whose attention runs on qkv; a 50-step training loop gives torch's loss
curve; torch.compile of a model that uses qkv.torch runs and gives eager's numbers.
"""
import copy

import pytest
import torch
import torch.nn as nn

import qkv
import qkv.torch as qt

torch.set_num_threads(2)

RTOL = 1e-4


def assert_close(name, got, ref, rtol=RTOL):
    """|got - ref| <= rtol * |ref| + rtol * 0.1 * max|ref|: the floor covers entries that are sums of many terms
    cancelling to ~0 (a weight gradient), where float32's error is relative to the terms, not to the sum."""
    got, ref = got.detach().double(), ref.detach().double()
    assert got.shape == ref.shape, f"{name}: shapes {tuple(got.shape)} vs {tuple(ref.shape)}"
    floor = rtol * 0.1 * max(1.0, float(ref.abs().max()))
    diff = (got - ref).abs()
    assert bool((diff <= rtol * ref.abs() + floor).all()), f"{name}: max |diff| {float(diff.max()):.3g}"


@pytest.fixture
def counted(monkeypatch):
    """Counts calls of qkv's forward kernel."""
    calls = []
    real = qkv._qkv._sdpa_forward
    monkeypatch.setattr(qkv._qkv, "_sdpa_forward", lambda *a: calls.append(1) or real(*a))
    return calls


def twin(torch_cls, qkv_cls, *args, **kwargs):
    """torch's module and qkv's, built from the same torch seed."""
    torch.manual_seed(0)
    ref = torch_cls(*args, **kwargs)
    torch.manual_seed(0)
    mine = qkv_cls(*args, **kwargs)
    return ref, mine


def assert_same_state(ref, mine):
    a, b = ref.state_dict(), mine.state_dict()
    assert list(a) == list(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def compare_grads(ref, mine):
    for (n1, p1), (n2, p2) in zip(ref.named_parameters(), mine.named_parameters()):
        assert n1 == n2
        assert_close(f"grad {n1}", p2.grad, p1.grad)


MHA_CASES = {
    "self_batch_first": dict(kw=dict(batch_first=True), self_attn=True),
    "self_seq_first": dict(kw=dict(batch_first=False), self_attn=True),
    "cross_kdim_vdim": dict(kw=dict(batch_first=True, kdim=6, vdim=5), self_attn=False),
    "bool_key_padding": dict(kw=dict(batch_first=True), self_attn=True, kpm="bool"),
    "float_attn_mask": dict(kw=dict(batch_first=False), self_attn=True, am="float"),
    "causal_hint": dict(kw=dict(batch_first=True), self_attn=True, am="causal", is_causal=True),
    "causal_hint_and_padding": dict(kw=dict(batch_first=True), self_attn=True, am="causal", kpm="bool",
                                    is_causal=True),
    "per_head_mask_and_padding": dict(kw=dict(batch_first=True), self_attn=True, am="3d", kpm="bool"),
    "no_bias": dict(kw=dict(batch_first=True, bias=False), self_attn=True),
    "unbatched": dict(kw=dict(batch_first=True), self_attn=True, unbatched=True),
}


@pytest.mark.parametrize("name", sorted(MHA_CASES))
def test_multihead_attention_matches_torch(name, counted):
    c = MHA_CASES[name]
    E, H, B, T, S = 16, 4, 3, 7, 9
    ref, mine = twin(nn.MultiheadAttention, qt.MultiheadAttention, E, H, **c["kw"])
    assert isinstance(mine, nn.MultiheadAttention)
    assert_same_state(ref, mine)
    gen = torch.Generator().manual_seed(1)
    bf = c["kw"]["batch_first"]
    shape = (lambda t, e: (t, e)) if c.get("unbatched") else (lambda t, e: (B, t, e) if bf else (t, B, e))
    if c["self_attn"]:
        x = torch.randn(*shape(T, E), generator=gen, requires_grad=True)
        q = k = v = x
        S = T
    else:
        q = torch.randn(*shape(T, E), generator=gen, requires_grad=True)
        k = torch.randn(*shape(S, 6), generator=gen, requires_grad=True)
        v = torch.randn(*shape(S, 5), generator=gen, requires_grad=True)
    kw = dict(need_weights=False, is_causal=c.get("is_causal", False))
    if c.get("kpm") == "bool":
        kpm = torch.zeros(B, S, dtype=torch.bool)
        kpm[0, -2:] = True
        kpm[2, -1] = True
        kw["key_padding_mask"] = kpm
    if c.get("am") == "float":
        kw["attn_mask"] = torch.randn(T, S, generator=gen)
    elif c.get("am") == "causal":
        kw["attn_mask"] = nn.Transformer.generate_square_subsequent_mask(T)
    elif c.get("am") == "3d":
        m = torch.rand(B * H, T, S, generator=gen) < 0.3
        m[..., 0] = False
        kw["attn_mask"] = m
    outs = []
    for mod in (ref, mine):
        for t in (q, k, v):
            t.grad = None
        out, w = mod(q, k, v, **kw)
        assert w is None
        out.backward(torch.ones_like(out))
        outs.append((out.detach(), [t.grad.clone() for t in {id(t): t for t in (q, k, v)}.values()]))
    assert counted, "the attention did not run on qkv"
    assert_close(f"{name} out", outs[1][0], outs[0][0])
    for a, b in zip(outs[1][1], outs[0][1]):
        assert_close(f"{name} input grad", a, b)
    compare_grads(ref, mine)


def test_multihead_attention_need_weights_is_torchs_path():
    ref, mine = twin(nn.MultiheadAttention, qt.MultiheadAttention, 8, 2, batch_first=True)
    x = torch.randn(2, 5, 8)
    o1, w1 = ref(x, x, x)
    o2, w2 = mine(x, x, x)
    assert_close("out", o2, o1)
    assert_close("weights", w2, w1)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_encoder_layer_matches_torch_in_train_and_eval(norm_first, batch_first, counted):
    ref, mine = twin(nn.TransformerEncoderLayer, qt.TransformerEncoderLayer, 16, 4, 32, dropout=0.0,
                     batch_first=batch_first, norm_first=norm_first)
    assert_same_state(ref, mine)
    x = torch.randn(3, 6, 16) if batch_first else torch.randn(6, 3, 16)
    kpm = torch.zeros(3, 6, dtype=torch.bool)
    kpm[1, -2:] = True
    mask = nn.Transformer.generate_square_subsequent_mask(6)
    y1 = ref(x, src_mask=mask, src_key_padding_mask=kpm, is_causal=True)
    y2 = mine(x, src_mask=mask, src_key_padding_mask=kpm, is_causal=True)
    assert_close("train", y2, y1)
    y1.sum().backward()
    y2.sum().backward()
    compare_grads(ref, mine)
    ref.eval(), mine.eval()
    n = len(counted)
    with torch.no_grad():  # torch would take its fused fast path here; qkv's layer keeps its attention on qkv
        assert_close("eval", mine(x, src_mask=mask), ref(x, src_mask=mask))
    assert len(counted) == n + 1


def test_decoder_layer_matches_torch(counted):
    ref, mine = twin(nn.TransformerDecoderLayer, qt.TransformerDecoderLayer, 16, 2, 24, dropout=0.0,
                     batch_first=True)
    assert_same_state(ref, mine)
    tgt, mem = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    mask = nn.Transformer.generate_square_subsequent_mask(5)
    mpm = torch.zeros(2, 7, dtype=torch.bool)
    mpm[0, -3:] = True
    y1 = ref(tgt, mem, tgt_mask=mask, memory_key_padding_mask=mpm, tgt_is_causal=True)
    y2 = mine(tgt, mem, tgt_mask=mask, memory_key_padding_mask=mpm, tgt_is_causal=True)
    assert_close("decoder", y2, y1)
    assert len(counted) == 2
    y1.square().sum().backward()
    y2.square().sum().backward()
    compare_grads(ref, mine)


def test_state_dict_loads_across_torch_and_qkv():
    ref = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    mine = qt.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    mine.load_state_dict(ref.state_dict())
    assert_same_state(ref, mine)
    ref.eval(), mine.eval()
    x = torch.randn(2, 4, 8)
    assert_close("loaded", mine(x), ref(x))


class TinyLM(nn.Module):
    def __init__(self, layer_cls, vocab=23, d=32, heads=4, layers=2, T=12):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(T, d) * 0.1)
        self.layers = nn.ModuleList([layer_cls(d, heads, 64, dropout=0.0, batch_first=True) for _ in range(layers)])
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(T))

    def forward(self, ids):
        x = self.emb(ids) + self.pos[: ids.shape[1]]
        for layer in self.layers:
            x = layer(x, src_mask=self.mask, is_causal=True)
        return self.head(x)


def test_training_loop_loss_curve_matches_torch(counted):
    torch.manual_seed(0)
    ref = TinyLM(nn.TransformerEncoderLayer)
    mine = TinyLM(qt.TransformerEncoderLayer)
    mine.load_state_dict(ref.state_dict())
    gen = torch.Generator().manual_seed(7)
    data = torch.randint(0, 23, (50, 4, 13), generator=gen)
    curves = []
    for model in (ref, mine):
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses = []
        for step in range(50):
            ids = data[step]
            logits = model(ids[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, 23), ids[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(torch.tensor(losses, dtype=torch.float64))
    assert len(counted) == 50 * 2
    assert curves[0][-1] < curves[0][0]  # it learns something
    rel = ((curves[1] - curves[0]).abs() / curves[0].abs()).max().item()
    assert rel <= 1e-4, f"loss curves differ by {rel:.3g} relative"


class CompiledAttention(nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        B, T, E = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, E // self.heads).permute(2, 0, 3, 1, 4)
        y = qt.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, E))


def test_torch_compile_of_a_model_using_qkv_runs_and_matches_eager(counted, monkeypatch):
    import torch._inductor.config

    # Compile for real each run: a cached graph would hide a change in the op's fake kernel.
    monkeypatch.setattr(torch._inductor.config, "force_disable_caches", True)
    torch.manual_seed(0)
    model = CompiledAttention()
    x = torch.randn(2, 9, 16, requires_grad=True)
    eager = model(x)
    eager.sum().backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    n = len(counted)
    y = compiled(x)
    y.sum().backward()
    assert len(counted) > n, "the compiled graph did not call qkv's kernel"
    assert_close("compiled out", y, eager)
    for p, g in zip(model.parameters(), eager_grads):
        assert_close("compiled grad", p.grad, g)


def test_torch_compile_of_qkv_encoder_layer_runs():
    torch.manual_seed(0)
    layer = qt.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    x = torch.randn(2, 6, 16)
    compiled = torch.compile(copy.deepcopy(layer), backend="aot_eager")
    assert_close("compiled layer", compiled(x, is_causal=True,
                                            src_mask=nn.Transformer.generate_square_subsequent_mask(6)),
                 layer(x, is_causal=True, src_mask=nn.Transformer.generate_square_subsequent_mask(6)))
