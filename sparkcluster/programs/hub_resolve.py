"""Asks the hub which commit a revision is and which files it holds (the hub's API:
GET /api/models/{repo}/revision/{revision}?blobs=true, huggingface_hub's `HfApi.model_info`). argv:
the endpoint, the repository, the revision; the token comes on stdin. Prints one JSON object: the
commit, whether the repository is gated and its files, or the hub's error.
"""

import json
import sys
import urllib.error
import urllib.parse
import urllib.request


def main(argv):
    endpoint, repo, rev = argv[1].rstrip("/"), argv[2], argv[3]
    token = sys.stdin.read().strip()
    url = f"{endpoint}/api/models/{repo}/revision/{urllib.parse.quote(rev, safe='')}?blobs=true"
    req = urllib.request.Request(url, headers={"Authorization": "Bearer " + token} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            info = json.load(r)
    except urllib.error.HTTPError as e:
        print(
            json.dumps(
                {
                    "error": e.headers.get("X-Error-Code") or "",
                    "status": e.code,
                    "message": e.headers.get("X-Error-Message") or str(e.reason),
                    "url": url,
                }
            )
        )
        return
    except (urllib.error.URLError, OSError, ValueError) as e:
        print(json.dumps({"error": "Unreachable", "status": 0, "message": str(getattr(e, "reason", e)), "url": url}))
        return
    files = []
    for s in info.get("siblings") or []:
        lfs = s.get("lfs") or None
        files.append(
            {
                "path": s["rfilename"],
                "size": (lfs or {}).get("size", s.get("size")),
                "blob": lfs["sha256"] if lfs else s.get("blobId"),
                "lfs": bool(lfs),
            }
        )
    print(json.dumps({"sha": info.get("sha"), "gated": info.get("gated") or False, "files": files}))


if __name__ == "__main__":
    main(sys.argv)
