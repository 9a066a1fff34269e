"""The two papers joined: a step verifier locates the doubtful step, the critic explains it, the generator revises
from there and the verifier reranks (`locate_explain_revise`)."""
