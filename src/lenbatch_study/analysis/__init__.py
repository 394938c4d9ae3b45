"""Prediction and reports: the step-time model, gradient quality, report rendering. No torch."""
