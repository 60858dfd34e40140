// placeholder: being written (issue 2); replaced before landing
