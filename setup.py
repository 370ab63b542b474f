"""Build the Cython extensions in native/ against a ggml installation.

ggml comes from GGSERVE_GGML_PREFIX (a prefix with include/ and lib/, as
scripts/build_ggml.sh installs: the ggml of the llama.cpp release the golden
data came from) or, without it, from the prebuilt libggml-python package. The
extensions get an rpath to that lib folder so no LD_LIBRARY_PATH is needed, and
native/_linked.py records it for the preload in native/__init__.py.
"""
import glob
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, find_namespace_packages, setup


def _libggml_dirs():
    root = os.environ.get("GGSERVE_GGML_PREFIX")
    if not root:
        import libggml

        root = os.path.dirname(libggml.__file__)
    include = os.path.join(root, "include")
    libdir = next(
        d for d in (os.path.join(root, "lib64"), os.path.join(root, "lib"))
        if os.path.isdir(d)
    )
    return include, libdir


def _extensions():
    include, libdir = _libggml_dirs()
    with open(os.path.join("native", "_linked.py"), "w") as f:
        f.write(f'"""Written by setup.py: the ggml the extensions were built against."""\nLIBDIR = {libdir!r}\n')
    exts = []
    for pyx in sorted(glob.glob("native/*.pyx")):
        name = "ggserve.native." + os.path.splitext(os.path.basename(pyx))[0]
        # the ggml module carries ggserve's own CPU kernels beside its bindings
        sources = [pyx] + (["native/kernels/matmul.c", "native/kernels/q5k_dot.c", "native/kernels/q6k_dot.c",
                            "native/kernels/iq4xs_dot.c"] if name.endswith(".ggml") else [])
        exts.append(
            Extension(
                name,
                sources,
                include_dirs=[include, numpy.get_include(), "native", "native/kernels"],
                library_dirs=[libdir],
                libraries=["ggml", "ggml-base", "ggml-cpu"],
                runtime_library_dirs=[libdir],
                extra_compile_args=["-O3"],
                define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            )
        )
    return cythonize(
        exts,
        include_path=["native"],
        language_level=3,
        compiler_directives={"cdivision": True},
    )


# Each top-level folder is one part of the ggserve package; every folder below
# it is a subpackage (the chat page's and the kernels' folders hold data only),
# found rather than listed.
PARTS = {"ggserve": "ggserve", "ggserve.native": "native", "ggserve.models": "models",
         "ggserve.server": "server"}


def _packages():
    found = []
    for name, folder in PARTS.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_namespace_packages(folder, exclude=["*__pycache__*"])]
    return found


setup(
    packages=_packages(),
    package_dir=PARTS,
    # the chat page's plain files, and the Cython declarations a rebuild needs
    package_data={"ggserve.native": ["*.pxd", "*.pxi"], "ggserve.native.kernels": ["*.c", "*.h"],
                  "ggserve.server.api.llama.webui": ["*.html", "*.js", "*.css"]},
    ext_modules=_extensions(),
)
