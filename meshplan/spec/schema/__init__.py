"""The request schema's parts: the Field type (field.py) and the fields of a training run (run.py), of how it
was set up (conditions.py) and of serving (serving.py). spec/requests.py joins them into the one table."""
