"""The HTTP layer: what every endpoint shares, one subpackage per API; maps typed errors to HTTP."""
