"""Utilities of torch_fl (``torch_fl.utils.cpp_extension``: building C++/CUDA extensions for flagos)."""
