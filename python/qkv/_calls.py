"""One-line TypeErrors for calls that match no signature of a binding.

pybind11 reports a call whose arguments match no overload (an unknown keyword, a wrong type) with the full
signature and the repr of every argument: an array argument turns that into kilobytes. The wrappers here turn it
into one line that names the function, its signature and what was passed (types and shapes, never values).
"""
import functools

MAX_SIGNATURE = 220


def _describe(value):
    shape = getattr(value, "shape", None)
    name = type(value).__name__
    if shape is not None:
        return f"{name} {tuple(shape)}"
    return name


def _signature(message):
    for line in message.splitlines():
        line = line.strip()
        if line.startswith("1. "):
            sig = line[3:]
            sig = sig[sig.find("("):] if "(" in sig else sig
            return sig if len(sig) <= MAX_SIGNATURE else sig[: MAX_SIGNATURE - 4] + " ...)"
    return "(see help())"


def _is_mismatch(err):
    text = str(err)
    return "incompatible function arguments" in text or "incompatible constructor arguments" in text


def _one_line(name, args, kwargs, err):
    got = [_describe(a) for a in args] + [f"{k}={_describe(v)}" for k, v in kwargs.items()]
    return TypeError(f"{name}: arguments ({', '.join(got)}) match no signature {_signature(str(err))}")


def function(fn, name):
    """fn with one-line TypeErrors for mismatched arguments."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError as err:
            if not _is_mismatch(err):
                raise
            raise _one_line(name, args, kwargs, err) from None
    return call


def method(fn, name):
    """An unbound method (self first) with one-line TypeErrors; the receiver is not listed."""
    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except TypeError as err:
            if not _is_mismatch(err):
                raise
            raise _one_line(name, args, kwargs, err) from None
    return call


def patch_class(cls, names=("__init__", "__call__", "forward", "load_state_dict")):
    """Wraps the listed methods of a bound class in place."""
    for attr in names:
        if attr in cls.__dict__:
            label = cls.__name__ if attr == "__init__" else f"{cls.__name__}.{attr}"
            value = cls.__dict__[attr]
            if isinstance(value, staticmethod):  # from_pretrained: no receiver
                setattr(cls, attr, staticmethod(function(value.__func__, label)))
            else:
                setattr(cls, attr, method(value, label))
    return cls
