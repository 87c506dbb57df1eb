"""Exceptions raised by hybridmpi."""


class SyncTimeout(RuntimeError):
    """A wait on a peer passed its deadline.

    Attributes:
        rank: rank (in the HybridComm's communicator) that timed out.
        peer: rank whose counter was watched, or None when several could be.
        counter: name of the watched counter (``"arrive"``, ``"release"``...).
        epoch: value the counter had to reach.
        missing: ranks of this node that had not entered the call.
    """

    def __init__(self, message, *, rank=None, peer=None, counter=None, epoch=None, missing=()):
        super().__init__(message)
        self.rank = rank
        self.peer = peer
        self.counter = counter
        self.epoch = epoch
        self.missing = tuple(missing)


class PeerError(RuntimeError):
    """A peer failed inside the same call (its error bits reached this rank), so this rank
    stops too instead of waiting for it.  The object of the call becomes unusable.

    Attributes:
        rank: this rank.
        peer: the rank whose error bits were seen (None when not known).
    """

    def __init__(self, message, *, rank=None, peer=None):
        super().__init__(message)
        self.rank = rank
        self.peer = peer


class FreedError(RuntimeError):
    """An object that owns MPI resources was used after ``free()``."""


class PatternError(ValueError):
    """A ghost pattern is inconsistent; raised on every rank of the communicator.

    The message names the rank where the problem was found, the peer and the
    offending id or count.
    """
