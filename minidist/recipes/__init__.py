"""Recipes: whole programs a reader starts from and changes, built on the library's public API only.

    train.py        ``python -m minidist train``: a GPT (or a Switch Transformer) on CPython's help() text,
                    any layout of the five axes given as flags (the nanoGPT ``train.py`` of minidist)
    train_loop.py   what one rank runs (Mesh + parallelize), and the same steps in one process (--check)
    train_files.py  the run's files: the checkpoint (weights .npz + config .json) and the loss curve
"""
