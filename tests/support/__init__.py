"""Test support code shared by the test packages (real control plane, helpers)."""
