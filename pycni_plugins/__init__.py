"""In-process CNI plugins for pycni: netlink through pyroute2, nftables through libnftables.

Each plugin is registered under its CNI type in the ``pycni.plugins`` entry point group (see
pyproject.toml) and can also run as a standard exec'd CNI plugin (``pycni plugins install DIR``).
"""
