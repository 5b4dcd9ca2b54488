"""How simulated kernel code fails: an errno, like a negative return in the kernel."""

ENOTSUPP = 524       # include/linux/errno.h: kernel-internal, yet CREATE_QUEUE returns it for a bad queue type


class SimErrno(Exception):
    def __init__(self, err, why=""):
        super().__init__(why)
        self.errno = err


class Blocked(Exception):
    """The call sleeps in the kernel (e.g. DESTROY_QUEUE of a suspended queue). The server checks
    `ready()` after every state change and then replies with `finish()`'s return value."""

    def __init__(self, ready, finish):
        super().__init__("blocked")
        self.ready, self.finish = ready, finish
