"""Packaging for both a ROS 2 ament_python build (colcon) and a plain pip install.

``colcon build --symlink-install`` runs this file through a symlink in its build folder
(with that folder as the working directory), where only the packages and the data files
are linked: every file is therefore found from the real location of this file (the
symlink resolved), and data files are listed relative to it, which is also where colcon
links them in the build folder.
"""

from glob import glob
from pathlib import Path

from setuptools import find_packages, setup

PACKAGE = "thinkmem_ros"
HERE = Path(__file__).resolve().parent  # the source folder, also through colcon's symlink
# each through ``entry``, which loads the command's modules under a Ctrl-C guard
EXECUTABLES = {
    "thinkmem": "thinkmem_ros.entry:thinkmem",
    "thinking_node": "thinkmem_ros.entry:thinking_node",
    "thinkmem_consolidator": "thinkmem_ros.entry:thinkmem_consolidator",
}


def requirements(name: str) -> list[str]:
    """Read requirements/<name>.txt, skipping comments, so pip and the Makefile agree."""
    path = HERE / "requirements" / f"{name}.txt"
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def model_files() -> list[tuple[str, list[str]]]:
    """Every shipped bundle folder under models/, installed to share/thinkmem_ros/models/."""
    out = []
    for folder in sorted((HERE / "models").glob("*")):
        files = [str(p.relative_to(HERE)) for p in sorted(folder.glob("*")) if p.is_file()]
        if folder.is_dir() and files:
            out.append((f"share/{PACKAGE}/models/{folder.name}", files))
    return out


robot = [r for r in requirements("robot") if not r.startswith("ros-")]
ros = [r for r in requirements("robot") if r.startswith("ros-")]

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*"]),
    python_requires=">=3.11",
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", sorted(glob("launch/*.launch.py", root_dir=HERE))),
        (f"share/{PACKAGE}/config", sorted(glob("config/*.yaml", root_dir=HERE))),
        (f"lib/{PACKAGE}", [f"ros_launchers/{exe}" for exe in EXECUTABLES]),
        *model_files(),
    ],
    install_requires=robot,
    extras_require={
        "ros": ros,
        "train": requirements("train"),
        "test": requirements("test"),
    },
    zip_safe=False,
    maintainer="thinkmem_ros maintainers",
    maintainer_email="maintainers@thinkmem.invalid",
    description="Learned situation-conditioned thinking policy for ROS 2 robots",
    license="Apache-2.0",
    tests_require=["pytest"],
    entry_points={
        "console_scripts": [f"{exe} = {target}" for exe, target in EXECUTABLES.items()],
    },
)
