"""Ships the YAML recipes (``configs/``) inside the wheel as ``inline_attn/configs`` so that an
installed package finds them (:func:`inline_attn.train.configs_dir`); everything else is in
pyproject.toml."""

import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithConfigs(build_py):
    def run(self):
        super().run()
        src = pathlib.Path(__file__).parent / "configs"
        if src.is_dir():
            dst = pathlib.Path(self.build_lib) / "inline_attn" / "configs"
            shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.pyc", "__pycache__"))


setup(cmdclass={"build_py": BuildPyWithConfigs})
