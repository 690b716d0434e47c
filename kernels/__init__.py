"""Triton kernels that address paged recurrent state through member-page ids and conv state
through slot line ids, each beside a torch reference (``kernels/<op>/``)."""
