"""torch custom ops where torch provides them (torch.library.custom_op, torch >= 2.4), so that
torch.compile and compiled serving graphs call libgdn without graph breaks; on older torch (CI runs
1.13) the decorated functions stay plain Python functions and the package works the same."""

import inspect

import torch

AVAILABLE = hasattr(torch, "library") and hasattr(torch.library, "custom_op") and hasattr(torch.library,
                                                                                         "register_fake")


_fakes = {}  # id(op) -> its fake implementation, taking the op's arguments
_bodies = {}  # id(op) -> the decorated function itself


def fake_of(op):
    """The fake implementation of an op made by custom_op."""
    return _fakes[id(op)]


def compiling():
    """Whether torch.compile or torch.export is tracing the caller (False on torch without them)."""
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(is_compiling()) if is_compiling is not None else False


# torch.func's wrapped tensors report type torch.Tensor; they go through the op, whose registered
# derivative torch.func can transform (ops._ChunkFunction's old-style forward it cannot).
_functorch_wrapped = getattr(getattr(getattr(torch, "_C", None), "_functorch", None), "is_functorch_wrapped_tensor",
                             None)
_dispatch_modes = getattr(getattr(torch, "_C", None), "_len_torch_dispatch_stack", None)


def _plain(t):
    """A plain tensor with storage: not a fake, functional or meta tensor of a tracer, nor one of
    torch.func's."""
    return (type(t) is torch.Tensor and not t.is_meta
            and not (_functorch_wrapped is not None and _functorch_wrapped(t)))


def eager(*args):
    """Whether a call on these arguments may run the op's body directly: no tracer (torch.compile,
    torch.export, torch.jit.trace) and no dispatch mode (make_fx, FlopCounterMode, ...) would miss
    it, and every tensor argument is plain."""
    if compiling() or torch.jit.is_tracing() or (_dispatch_modes is not None and _dispatch_modes() > 0):
        return False
    return all(_plain(t) for t in args if isinstance(t, torch.Tensor))


def call(op, *args):
    """op(*args), through its body directly where eager(*args): the dispatcher's round trip for a
    custom op (argument checks, autograd wrapping) is a large part of a small call's host time,
    which bounds small eager training steps and eager decoding. Only for ops that mutate nothing
    (the dispatcher bumps the version counters of mutated inputs) and that are either forward-only
    (the public functions warn where gradients are asked for) or differentiated by the caller
    where they run eagerly (ops.py's _ChunkFunction): the body is not differentiable by itself."""
    return _bodies[id(op)](*args) if eager(*args) else op(*args)


def custom_op(name, *, mutates_args, fake, autograd=None):
    """Decorator: the function as the custom op `name` (mutates_args as torch.library.custom_op
    takes them), with fake(arguments) giving its outputs' shapes and dtypes from the arguments by
    name (a dict) for tracing, and autograd = (setup_context, backward) registered as the op's
    derivative (torch.library's register_autograd signatures). Without custom ops in this torch,
    the function itself (ops.py differentiates it through a torch.autograd.Function on every
    torch). Either way fake_of(result) gives the fake implementation (the tests compare it with
    real outputs on every torch)."""
    def wrap(fn):
        signature = inspect.signature(fn)

        def fake_impl(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return fake(bound.arguments)

        op = fn
        if AVAILABLE:
            op = torch.library.custom_op(name, mutates_args=mutates_args)(fn)
            op.register_fake(fake_impl)
            if autograd is not None:
                op.register_autograd(autograd[1], setup_context=autograd[0])
        _fakes[id(op)] = fake_impl
        _bodies[id(op)] = fn
        return op
    return wrap
