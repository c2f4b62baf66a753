"""The agent as a launchd (macOS) or systemd (Linux) service: the install plan, the plist and
unit files, the scope and account, launchctl and the service managers. Imports only shared/."""
