"""The ZooKeeper store of cluster metadata: Kafka's ZooKeeper-mode znodes, through kazoo.

``znodes`` holds the layout and the JSON codecs, ``client`` the only code that talks to
ZooKeeper, ``config`` the ``zookeeper.*`` settings.
"""
