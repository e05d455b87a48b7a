"""The model zoo as ordered, partitionable layer sequences (torch)."""
