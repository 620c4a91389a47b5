"""placeholder"""
from ._ubep import *  # noqa
