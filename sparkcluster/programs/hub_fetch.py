"""One small file of a commit from the hub (a model's config.json), printed. argv: the endpoint,
the repository, the commit, the file's path; the token comes on stdin."""

import sys
import urllib.parse
import urllib.request


def main(argv):
    endpoint, repo, commit, path = argv[1].rstrip("/"), argv[2], argv[3], argv[4]
    token = sys.stdin.read().strip()
    url = f"{endpoint}/{repo}/resolve/{commit}/{urllib.parse.quote(path)}"
    req = urllib.request.Request(url, headers={"Authorization": "Bearer " + token} if token else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        sys.stdout.write(r.read(1 << 20).decode("utf-8", "replace"))


if __name__ == "__main__":
    main(sys.argv)
