"""What a user sees when TVM's torch importer cannot take a program (installed by
:mod:`tessera_tvm.frontend_fixes`, in both TVMs): a :class:`TesseraError` that names the torch op and
the user's line (torch.export's stack trace). Before, an op with no converter stopped the import with
TVM's ``AssertionError: Unsupported function types ['aten_op']`` (no line), and a converter that failed
on its arguments with a traceback from inside TVM (MPT's ``nn.LayerNorm(bias=False)``: ``KeyError:
None``)."""

from __future__ import annotations

from .errors import TesseraError
from .frontend_masks import _packet_name, _where_written


def install_import_errors(importer_class) -> None:
    """Make ``importer_class`` (TVM's ``ExportedProgramImporter``) name the op and line of a failure."""
    make_table = importer_class.create_convert_map

    def create_convert_map(self):
        return {name: _named(convert) for name, convert in make_table(self).items()}

    def check_converters(self, nodes):
        missing = {}
        for node in nodes:
            if node.op == "call_function" and _packet_name(node) not in self.convert_map:
                missing.setdefault(_packet_name(node), node)
        if missing:
            ops = "; ".join(f"{node.target}{_where_written(node)}" for node in missing.values())
            raise TesseraError(
                f"TVM's torch importer has no converter for {ops}. Write that line with other torch ops "
                "(where the import ran with run_ep_decomposition=False, the default True may rewrite the op "
                "into ones it has)"
            )

    importer_class.create_convert_map = create_convert_map
    importer_class._check_unsupported_func_type = check_converters


def _named(convert):
    """``convert`` whose failures (other than Tessera's own errors) name the node's op and line."""

    def converted(node, *rest):
        try:
            return convert(node, *rest)
        except TesseraError:
            raise
        except Exception as exc:
            raise TesseraError(
                f"TVM's torch importer failed on {node.target}{_where_written(node)}: {type(exc).__name__}: {exc}"
            ) from exc

    return converted
