"""Runs in a throwaway container of the cluster image (it has huggingface_hub): fetches one snapshot
into the head's cache (HF_HOME), saying on stderr every half second how many bytes the repository's
blobs hold ("@@bytes N", finished blobs and .incomplete ones: the controller's bar), and printing
the snapshot's folder. argv: the repository, the commit, its cache folder, then the files a profile
reads from it (a plugin), when not the whole snapshot (huggingface_hub's `snapshot_download`,
`allow_patterns`: https://huggingface.co/docs/huggingface_hub/guides/download).
"""

import os
import sys
import threading
import time


def report(blobs):
    while True:
        total = 0
        try:
            for n in os.listdir(blobs):
                try:
                    total += os.path.getsize(os.path.join(blobs, n))
                except OSError:
                    pass
        except OSError:
            pass
        print(f"@@bytes {total}", file=sys.stderr, flush=True)
        time.sleep(0.5)


def main(argv):
    repo, commit, folder, only = argv[1], argv[2], argv[3], argv[4:]
    blobs = os.path.join(os.environ["HF_HOME"], "hub", folder, "blobs")
    threading.Thread(target=report, args=(blobs,), daemon=True).start()
    from huggingface_hub import snapshot_download  # the image's, not the controller's

    print(snapshot_download(repo, revision=commit, allow_patterns=only or None), flush=True)


if __name__ == "__main__":
    main(sys.argv)
