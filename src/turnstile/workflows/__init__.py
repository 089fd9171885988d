"""Workflow engines without polling: callback grants and their deliverer, the SQS bridge for
AWS Step Functions, execution-aware permits, the queue dispatcher and the Lambda helper.

See ``docs/workflows.md``.
"""
