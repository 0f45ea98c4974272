"""Colours of the HTML report: the Okabe–Ito palette (distinguishable with every common form of
colour blindness), one colour per family of failure modes, sequential ramps for the confusion
matrix, and the WCAG contrast arithmetic that picks black or white text for a background.

Pure values and functions; :mod:`detectors.scoring.report` draws with them.
"""

from __future__ import annotations

# Okabe & Ito, "Color Universal Design" (2008): the eight colours, as hex.
OKABE_ITO = {
    "black": "#000000", "orange": "#E69F00", "sky_blue": "#56B4E9", "bluish_green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "reddish_purple": "#CC79A7",
}
GREY = "#8C8C8C"  # for what needs no attention (application errors); not one of the eight, kept neutral

# Failure modes grouped by what breaks; a family is one colour, its modes are told apart by the
# label on the bar (and drain-worthy vs ticket-only by solid vs hatched fill).
FAMILIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("GPU memory", OKABE_ITO["blue"], ("gpu_dram_uce", "gpu_row_remap_failure", "gpu_row_remap_pending",
                                       "gpu_sram_uce", "gpu_ecc_sbe_storm")),
    ("GPU device", OKABE_ITO["vermillion"], ("gpu_fell_off_bus", "gpu_hw_error", "gpu_gsp_error")),
    ("NVLink", OKABE_ITO["reddish_purple"], ("gpu_nvlink_error",)),
    ("GPU thermal", OKABE_ITO["orange"], ("gpu_thermal",)),
    ("PCIe", OKABE_ITO["bluish_green"], ("pcie_link_degraded", "pcie_fatal")),
    ("network port", OKABE_ITO["sky_blue"], ("net_link_bad_cable", "net_link_down")),
    ("host memory", OKABE_ITO["yellow"], ("host_dram_uce", "host_dram_ce_storm")),
    ("host unreachable", OKABE_ITO["black"], ("host_unreachable",)),
    ("application", GREY, ("app_error",)),
)
_MODE_COLOUR = {m: c for _, c, modes in FAMILIES for m in modes}

# Confusion-matrix ramps (low count -> high count): blue for correct and explained detections,
# vermillion for false positives. Stops are sRGB hex, interpolated linearly.
RAMP_OK = ("#EAF3FA", "#56B4E9", "#0072B2", "#00314D")
RAMP_FP = ("#FBEDE3", "#E69F00", "#D55E00", "#6B2F00")


def mode_colour(mode: str) -> str:
    return _MODE_COLOUR.get(mode, GREY)


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    h = hex_colour.lstrip("#")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


def luminance(hex_colour: str) -> float:
    """WCAG 2 relative luminance of an sRGB colour."""
    def lin(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.04045 else ((s + 0.055) / 1.055) ** 2.4

    r, g, b = (lin(c) for c in _rgb(hex_colour))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    """WCAG 2 contrast ratio of two colours (1 to 21)."""
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def text_on(background: str) -> str:
    """Black or white, whichever reads better on ``background`` (always >= 4.58:1)."""
    return "#000000" if contrast(background, "#000000") >= contrast(background, "#FFFFFF") else "#FFFFFF"


def ramp(stops: tuple[str, ...], t: float) -> str:
    """The colour at ``t`` in [0, 1] along ``stops``."""
    t = min(1.0, max(0.0, t))
    pos = t * (len(stops) - 1)
    i = min(int(pos), len(stops) - 2)
    f = pos - i
    a, b = _rgb(stops[i]), _rgb(stops[i + 1])
    return "#{:02X}{:02X}{:02X}".format(*(round(x + (y - x) * f) for x, y in zip(a, b, strict=True)))
