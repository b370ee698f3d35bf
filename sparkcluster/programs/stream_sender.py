"""A plain byte pipe for files (the weights stage): stdin framed to the receiver's "stdout" sink,
so a cut stream ends in STREAM_CUT, never in a short tar. argv: as framing's."""

import sys

from sparkcluster.programs.framing import Sender


def main(argv):
    link = Sender(argv)
    link.pump(link.inp)
    link.finish()


if __name__ == "__main__":
    main(sys.argv)
