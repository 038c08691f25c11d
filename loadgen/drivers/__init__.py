"""Drivers: I/O only. They send planned requests and feed bytes to the core's tracker."""
