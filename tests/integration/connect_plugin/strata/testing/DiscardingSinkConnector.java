package strata.testing;

import java.util.Collections;
import java.util.List;
import java.util.Map;

import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.sink.SinkConnector;

/** A sink connector that reads its topics and drops the records: Connect's consumer group and
 *  its offsets are what the Strata tests look at. */
public class DiscardingSinkConnector extends SinkConnector {
    @Override public void start(Map<String, String> props) { }
    @Override public Class<? extends Task> taskClass() { return DiscardingSinkTask.class; }
    @Override public List<Map<String, String>> taskConfigs(int maxTasks) {
        return Collections.singletonList(Collections.emptyMap());
    }
    @Override public void stop() { }
    @Override public ConfigDef config() { return new ConfigDef(); }
    @Override public String version() { return "1.0"; }
}
