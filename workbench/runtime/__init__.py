"""Execution under torchrun: process groups, stages, the schedule interpreter and strategies."""
