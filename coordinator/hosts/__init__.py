"""The lab's hosts: the hostfile, the agents' public keys, deploying to a Mac over ssh, and the
link every command reaches an agent by (link.py). Imports no other room of coordinator/."""
