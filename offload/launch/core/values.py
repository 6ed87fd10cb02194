"""Value classes: what the house used `dataclasses` for, without its start-up cost (its import,
with inspect, ast and dis, and each class's generated methods: a fifth of a helper's start)."""


class Value:
    """Fields: the annotations of the class and its bases, in order; a default: the class
    attribute of that name, or FRESH[name]() for each instance. Built by position or
    keyword; equal (and, when FROZEN, hashed) by the fields not in UNCOMPARED."""

    FROZEN, FRESH, UNCOMPARED = True, {}, ()

    def __init_subclass__(cls):
        cls.FIELDS = tuple(dict.fromkeys(name for klass in reversed(cls.__mro__[:-2])
                                         for name in vars(klass).get("__annotations__", {})))
        cls.__hash__ = Value.__hash__ if cls.FROZEN else None

    def __init__(self, *args, **kwargs):
        cls = type(self)
        if len(args) > len(cls.FIELDS) or set(kwargs) - set(cls.FIELDS[len(args):]):
            raise TypeError(f"{cls.__name__}: fields are {', '.join(cls.FIELDS)}")
        values = dict(zip(cls.FIELDS, args), **kwargs)
        for name in cls.FIELDS:
            if name in values or name in cls.FRESH:
                value = values[name] if name in values else cls.FRESH[name]()
                object.__setattr__(self, name, value)
            elif not hasattr(cls, name):
                raise TypeError(f"{cls.__name__}: {name} is missing")

    def __setattr__(self, name, value):
        if self.FROZEN:
            raise AttributeError(f"{type(self).__name__} is frozen: {name} cannot be set")
        object.__setattr__(self, name, value)

    def compared(self) -> tuple:
        return tuple(getattr(self, name) for name in self.FIELDS if name not in self.UNCOMPARED)

    def __eq__(self, other):
        return self.compared() == other.compared() if type(other) is type(self) \
            else NotImplemented

    def __hash__(self):
        return hash(self.compared())

    def __repr__(self):
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.FIELDS)
        return f"{type(self).__name__}({shown})"

    def replace(self, **changes):
        """A copy with these fields changed."""
        return type(self)(**dict({name: getattr(self, name) for name in self.FIELDS}, **changes))
