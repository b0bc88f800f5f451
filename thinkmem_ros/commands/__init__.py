"""Sub-commands of the ``thinkmem`` command, one module per verb.

Shared here: what every verb needs to answer bad input with one line on stderr (the output
checks live in ``core.output_files``, which the benchmark modules use as well).
"""

from __future__ import annotations

from pathlib import Path

from thinkmem_ros.core.output_files import (  # noqa: F401 - the verbs import them from here
    check_output,
    json_report,
    one_line,
)


def check_plot(path: str | Path, option: str) -> Path:
    """``path`` when matplotlib can save a figure in its format and it can be written there.

    The figure is saved after the run: an unknown suffix (``lat.txt``) used to be refused
    by matplotlib only then, and the minutes of results went with it. No suffix is fine:
    matplotlib then saves a PNG and appends ``.png``.
    """
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(path).suffix.removeprefix(".").lower()
    # without a suffix matplotlib writes path + ".png", never ``path`` itself
    path = check_output(path, option, replaces=("an image", _image_file) if suffix else None)
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix not in formats:
        raise SystemExit(f"{option} {path}: cannot save a plot as {path.suffix!r}; use one of "
                         f"{', '.join('.' + f for f in sorted(formats))}")
    return path


_IMAGE_MAGIC = {"png": (b"\x89PNG\r\n\x1a\n",), "pdf": (b"%PDF",), "jpg": (b"\xff\xd8\xff",),
                "jpeg": (b"\xff\xd8\xff",), "tif": (b"II*\x00", b"MM\x00*"),
                "tiff": (b"II*\x00", b"MM\x00*"), "webp": (b"RIFF",),
                "eps": (b"%!PS",), "ps": (b"%!PS",)}


def _image_file(path: Path) -> bool:
    """Whether an existing plot output is an image (so replacing it loses no data)."""
    suffix = path.suffix.removeprefix(".").lower()
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    if suffix in ("svg", "svgz"):
        return b"<svg" in head or head.startswith(b"\x1f\x8b")
    if suffix not in _IMAGE_MAGIC:  # a rarer format (pgf, raw, ...): no signature to check
        return True
    return head.startswith(_IMAGE_MAGIC[suffix])

