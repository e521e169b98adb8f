"""Helpers shared by test folders of several services (imported, unlike conftest.py fixtures)."""
