"""A Gated DeltaNet attention layer (torch nn.Module) with libgdn kernels for the core: how the
functions are meant to be used in model code. Projections, the causal short convolution and the
gated RMS norm are plain torch; prefill runs chunk_gated_delta_rule, single-token decode
fused_recurrent_gated_delta_rule, with gating, beta and q/k normalisation computed in-kernel.
Its parameters and math follow FLA's fla.layers.GatedDeltaNet (equal-length batches). It trains
through the chunked function's backward: on the CPU, and on CUDA with bf16 or f16 weights (the
CUDA backward's inputs) and head dims 64 or 128.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .ops import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


class GatedDeltaNet(nn.Module):
    r"""
    Gated DeltaNet layer.

    Args:
        hidden_size (int): model width `D`. Default: 2048.
        expand_v (float): value head dim over key head dim. Default: 2.
        head_dim (int): key head dim `K` (libgdn kernels take 64, 128 or 256). Default: 256.
        num_heads (int): query/key heads `H`. Default: 6.
        num_v_heads (Optional[int]): value heads `HV` (GVA when `HV > H`). Default: `num_heads`.
        use_gate (bool): gated output norm `rmsnorm(o) * silu(g_proj(x))`. Default: `True`.
        use_short_conv (bool): causal depthwise convolutions on q, k, v. Default: `True`.
        allow_neg_eigval (bool): `beta = 2 * sigmoid(b)`. Default: `False`.
        conv_size (int): short convolution width. Default: 4.
        conv_bias (bool): bias in the short convolutions. Default: `False`.
        norm_eps (float): RMS norm epsilon. Default: 1e-5.

    Inputs:
        hidden_states (torch.Tensor): `[B, T, D]`.
        cache (Optional[dict]): the state of an earlier call (`use_cache=True`):
            `recurrent_state` `[B, HV, V, K]` float32 and `conv_state` (three `[B, C, conv_size - 1]`).
        use_cache (bool): return the cache for the next call.

    Returns:
        o (torch.Tensor): `[B, T, D]`.
        cache (Optional[dict]): the updated cache if `use_cache`, else `None`.

    Examples::
        >>> layer = GatedDeltaNet(hidden_size=512, head_dim=64, num_heads=4, num_v_heads=8).cuda().bfloat16()
        >>> y, cache = layer(x_prompt, use_cache=True)             # prefill: chunked kernel
        >>> y1, cache = layer(x_next, cache=cache, use_cache=True)  # decode: recurrent kernel
    """

    def __init__(self, hidden_size=2048, expand_v=2, head_dim=256, num_heads=6, num_v_heads=None, use_gate=True,
                 use_short_conv=True, allow_neg_eigval=False, conv_size=4, conv_bias=False, norm_eps=1e-5,
                 device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.num_v_heads = num_v_heads if num_v_heads is not None else num_heads
        self.head_k_dim = head_dim
        self.head_v_dim = int(head_dim * expand_v)
        if not math.isclose(head_dim * expand_v, self.head_v_dim, rel_tol=1e-5):
            raise ValueError(f"expand_v={expand_v} does not give an integer value head dim for head_dim={head_dim}")
        if self.num_v_heads % self.num_heads != 0:
            raise ValueError(f"num_v_heads={self.num_v_heads} must be divisible by num_heads={self.num_heads}")
        self.key_dim = self.num_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.use_gate = use_gate
        self.use_short_conv = use_short_conv
        self.allow_neg_eigval = allow_neg_eigval
        self.conv_size = conv_size
        self.norm_eps = norm_eps

        self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False, **factory)
        self.k_proj = nn.Linear(hidden_size, self.key_dim, bias=False, **factory)
        self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False, **factory)
        self.a_proj = nn.Linear(hidden_size, self.num_v_heads, bias=False, **factory)
        self.b_proj = nn.Linear(hidden_size, self.num_v_heads, bias=False, **factory)
        # A in [0, 16) and dt in [1e-3, 0.1] as in Mamba2 / FLA; the gate parameters stay float32.
        A = torch.empty(self.num_v_heads, dtype=torch.float32, device=device).uniform_(0, 16)
        self.A_log = nn.Parameter(torch.log(A))
        dt = torch.exp(torch.rand(self.num_v_heads, device=device) * (math.log(0.1) - math.log(1e-3))
                       + math.log(1e-3)).clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        if use_short_conv:
            self.q_conv1d = nn.Conv1d(self.key_dim, self.key_dim, conv_size, groups=self.key_dim, bias=conv_bias,
                                      **factory)
            self.k_conv1d = nn.Conv1d(self.key_dim, self.key_dim, conv_size, groups=self.key_dim, bias=conv_bias,
                                      **factory)
            self.v_conv1d = nn.Conv1d(self.value_dim, self.value_dim, conv_size, groups=self.value_dim,
                                      bias=conv_bias, **factory)
        if use_gate:
            self.g_proj = nn.Linear(hidden_size, self.value_dim, bias=False, **factory)
        self.o_norm_weight = nn.Parameter(torch.ones(self.head_v_dim, **factory))
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False, **factory)

    def _short_conv(self, conv, x, state):
        """Causal depthwise convolution + SiLU over x [B, T, C]; state [B, C, W - 1] holds the
        inputs before x (zeros at the start). Returns (y, new_state)."""
        xt = x.transpose(1, 2)
        if state is None:
            state = xt.new_zeros(xt.shape[0], xt.shape[1], self.conv_size - 1)
        full = torch.cat([state.to(xt.dtype), xt], dim=-1)
        y = F.conv1d(full, conv.weight, conv.bias, groups=conv.groups)
        return F.silu(y).transpose(1, 2).contiguous(), full[..., full.shape[-1] - (self.conv_size - 1):].detach()

    def _core(self, q, k, v, a, b, state, output_final_state):
        """The delta-rule core: q, k [B, T, H, K], v [B, T, HV, V], raw gates a, b [B, T, HV],
        state [B, HV, V, K] float32 or None. Returns (o, final state or None)."""
        kernel = fused_recurrent_gated_delta_rule if q.shape[1] == 1 else chunk_gated_delta_rule
        return kernel(
            q, k, v, g=a, beta=b,
            initial_state=state,
            output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True,
            A_log=self.A_log,
            dt_bias=self.dt_bias,
            use_beta_sigmoid_in_kernel=True,
            allow_neg_eigval=self.allow_neg_eigval,
            state_v_first=True,
        )

    def forward(self, hidden_states, cache=None, use_cache=False):
        B, T, _ = hidden_states.shape
        conv_q = conv_k = conv_v = None
        if cache is not None and self.use_short_conv:
            conv_q, conv_k, conv_v = cache["conv_state"]
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        if self.use_short_conv:
            q, conv_q = self._short_conv(self.q_conv1d, q, conv_q)
            k, conv_k = self._short_conv(self.k_conv1d, k, conv_k)
            v, conv_v = self._short_conv(self.v_conv1d, v, conv_v)
        else:
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        q = q.view(B, T, self.num_heads, self.head_k_dim)
        k = k.view(B, T, self.num_heads, self.head_k_dim)
        v = v.reshape(B, T, self.num_v_heads, self.head_v_dim)
        a = self.a_proj(hidden_states)
        b = self.b_proj(hidden_states)

        state = cache["recurrent_state"] if cache is not None else None
        o, state = self._core(q, k, v, a, b, state, use_cache)

        o32 = o.float()
        o32 = o32 * torch.rsqrt(o32.pow(2).mean(-1, keepdim=True) + self.norm_eps) * self.o_norm_weight.float()
        if self.use_gate:
            gate = self.g_proj(hidden_states).view(B, T, self.num_v_heads, self.head_v_dim)
            o32 = o32 * F.silu(gate.float())
        o = self.o_proj(o32.to(hidden_states.dtype).reshape(B, T, self.value_dim))
        new_cache = None
        if use_cache:
            new_cache = {"recurrent_state": state,
                         "conv_state": (conv_q, conv_k, conv_v) if self.use_short_conv else None}
        return o, new_cache
