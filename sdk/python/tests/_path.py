"""Puts the SDK source tree (sdk/python) first on sys.path for the tests."""

import os
import sys

SDK_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if SDK_ROOT not in sys.path:
    sys.path.insert(0, SDK_ROOT)
