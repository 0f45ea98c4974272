"""The composition root: the ``fleethealth`` CLI and the wiring of run / demo / fleet-metrics.

The only package that imports every part (collectors, detectors, remediation, simulator, dashboards).
"""
