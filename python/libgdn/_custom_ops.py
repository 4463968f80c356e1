"""torch custom ops where torch provides them (torch.library.custom_op, torch >= 2.4), so that
torch.compile and compiled serving graphs call libgdn without graph breaks; on older torch (CI runs
1.13) the decorated functions stay plain Python functions and the package works the same."""

import inspect

import torch

AVAILABLE = hasattr(torch, "library") and hasattr(torch.library, "custom_op") and hasattr(torch.library,
                                                                                         "register_fake")


_fakes = {}  # id(op) -> its fake implementation, taking the op's arguments


def fake_of(op):
    """The fake implementation of an op made by custom_op."""
    return _fakes[id(op)]


def custom_op(name, *, mutates_args, fake):
    """Decorator: the function as the custom op `name` (mutates_args as torch.library.custom_op
    takes them), with fake(arguments) giving its outputs' shapes and dtypes from the arguments by
    name (a dict) for tracing. Without custom ops in this torch, the function itself. Either way
    fake_of(result) gives the fake implementation (the tests compare it with real outputs on
    every torch)."""
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
        _fakes[id(op)] = fake_impl
        return op
    return wrap
