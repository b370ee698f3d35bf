"""The start of every program sparkcluster runs on a host or in a container: its own text goes as
`python3 -c`, followed by the module to run and its arguments (early on the command line, where `ps`
and `pgrep -f` see them), then the bundle: the sources of the program's modules, as
`programs.bundle` packs them. The bundle's modules are imported from memory as the package's own, so the
programs import one another as they do in the package; nothing is written or installed on the node.
"""

import base64
import importlib.abc
import importlib.util
import json
import runpy
import sys
import zlib


class Bundle(importlib.abc.InspectLoader, importlib.abc.MetaPathFinder):
    """Finds and loads the bundle's modules; a package the bundle names only as a prefix
    (`sparkcluster`, `sparkcluster.programs`) is an empty one."""

    def __init__(self, sources):
        self.sources = sources

    def is_package(self, fullname):
        return fullname not in self.sources and any(m.startswith(fullname + ".") for m in self.sources)

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.sources or self.is_package(fullname):
            return importlib.util.spec_from_loader(
                fullname, self, origin="<sparkcluster:" + fullname + ">", is_package=self.is_package(fullname)
            )
        return None

    def get_source(self, fullname):
        return self.sources.get(fullname, "")

    def get_code(self, fullname):
        return compile(self.get_source(fullname), "<sparkcluster:" + fullname + ">", "exec")


def unpack(text):
    """The bundle's text (base64 of zlib of a JSON object: module name -> source) as that object."""
    return json.loads(zlib.decompress(base64.b64decode(text)).decode("utf-8"))


def main(argv):
    module, packed = argv[1], argv[-1]
    sys.meta_path.insert(0, Bundle(unpack(packed)))
    sys.argv = [module, *argv[2:-1]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv)
